"""Triton's classification extension without a server: the count an HTTP or gRPC output asks
for (refused in Triton's words), the top classes of an output as Triton writes them, and the
labels a model's ``label_filename`` gives (read as Triton's core reads them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from inferpool.broker.kserve.classification import (
    MAX_ELEMENTS,
    ModelClasses,
    classify,
    grpc_count,
    http_count,
    top_classes,
)
from inferpool.broker.kserve.grpc_infer import infer_message
from inferpool.broker.kserve.http_infer import parse_body
from inferpool.broker.models.ensemble_config import wiring
from inferpool.broker.models.labels import Labels, inherit, read_labels
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError

BATCHED = ModelClasses(True, {"P": ["zero", "", "two"]}, 1)
UNBATCHED = ModelClasses(False, {}, 2)


def refused(message: str, code: Code = Code.INVALID_ARG) -> Any:
    return pytest.raises(InferpoolError, check=lambda e: e.code is code and e.message == message)


def strings(shape: list[int], serialized: bytes) -> list[str]:
    return [b.decode() for b in codec.deserialize_bytes(serialized, codec.element_count(shape))]


# ============================================================================ requests
def test_http_counts_and_refusals() -> None:
    assert http_count({}) == 0
    assert http_count({"classification": 0}) == 0  # Triton: the output's own tensor
    assert http_count({"classification": 3, "binary_data": True}) == 3
    for bad in (-1, 1.5, True, "2", None):
        with refused(
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer"
        ):
            http_count({"classification": bad})
    with refused("Output can't set both 'shared_memory_region' and 'classification'"):
        http_count({"classification": 0, "shared_memory_region": "r"})


def test_an_http_body_asking_for_classes() -> None:
    call = parse_body(
        b'{"inputs": [], "outputs": [{"name": "O", "parameters": {"classification": 2, '
        b'"binary_data": false}}, {"name": "P"}]}',
        None,
        "m",
        "",
    )
    assert call.classes == {"O": 2} and call.binary == {"O": False, "P": False}
    assert call.header["outputs"] == [{"name": "O"}, {"name": "P"}]  # the broker sees none


def test_grpc_counts_and_refusals() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.outputs.add(name="O").parameters["classification"].int64_param = 3
    request.outputs.add(name="P")
    message = infer_message(request, single_response=True)
    assert message.classes == {"O": 3}
    assert message.header["outputs"] == [{"name": "O"}, {"name": "P"}]

    def output(**set_param: Any) -> Any:
        out = pb.ModelInferRequest().outputs.add(name="O")
        for field, value in set_param.items():
            setattr(out.parameters["classification"], field, value)
        return out

    with refused("invalid value type for 'classification' parameter, expected int64_param"):
        grpc_count(output(uint64_param=2).parameters)
    for value in (0, -2):
        with refused("invalid value for 'classification' parameter, expected >= 0"):
            grpc_count(output(int64_param=value).parameters)
    both = output(int64_param=1)
    both.parameters["shared_memory_region"].string_param = "r"
    with refused("output can't set both 'shared_memory_region' and 'classification'"):
        grpc_count(both.parameters)


# ============================================================================ answers
def test_top_classes_of_a_batch_with_labels() -> None:
    values = np.array([[1.1, 3.3, 0.5, 2.4], [0.0, -1.0, 7.0, 7.0]], np.float32)
    shape, data = top_classes(values.tobytes(), "FP32", [2, 4], 3, BATCHED, "P")
    assert shape == [2, 3]
    assert strings(shape, data) == [
        "3.300000:1",  # an empty line gives no label
        "2.400000:3",  # nor does an index past the file's end
        "1.100000:0:zero",
        "7.000000:2:two",  # equal values by index
        "7.000000:3",
        "0.000000:0:zero",
    ]


def test_top_classes_unbatched_integers_and_more_asked_than_there_are() -> None:
    values = np.array([[5, 250], [7, 9]], np.uint8)
    shape, data = top_classes(values.tobytes(), "UINT8", [2, 2], 10, UNBATCHED, "O")
    assert shape == [4]  # the whole tensor is one element's classes
    assert strings(shape, data) == ["250:1", "9:3", "7:2", "5:0"]
    big = np.array([2**63 + 1, 3], np.uint64)
    assert strings([1], top_classes(big.tobytes(), "UINT64", [2], 1, UNBATCHED, "O")[1]) == [
        "9223372036854775809:0"
    ]


def test_nan_ranks_as_minus_infinity() -> None:
    values = np.array([-np.inf, np.nan, -5.0, 1.0], np.float64)
    shape, data = top_classes(values.tobytes(), "FP64", [4], 4, UNBATCHED, "O")
    assert strings(shape, data) == ["1.000000:3", "-5.000000:2", "-inf:0", "nan:1"]


def test_what_cannot_be_classified() -> None:
    for datatype in ("FP16", "BF16", "BOOL", "BYTES"):
        with refused(f"class result not available for output due to unsupported type '{datatype}'"):
            top_classes(b"\x00\x00", datatype, [1], 1, UNBATCHED, "O")
    too_many = np.zeros(MAX_ELEMENTS + 1, np.int8)
    with refused("classification output tensor too large"):
        top_classes(too_many.tobytes(), "INT8", [1, MAX_ELEMENTS + 1], 1, BATCHED, "O")


def test_classify_replaces_the_outputs_asked_for() -> None:
    region: dict[str, Any] = {"name": "R", "datatype": "FP32", "shape": [1]}
    region["parameters"] = {"shared_memory_region": "r"}
    asked: dict[str, Any] = {"name": "P", "datatype": "INT32", "shape": [1, 3]}
    other: dict[str, Any] = {"name": "Q", "datatype": "INT32", "shape": [1, 3]}
    raw = np.array([4, 6, 5], np.int32).tobytes()
    tensors = classify({"outputs": [region, asked, other]}, [raw, raw], {"P": 2}, BATCHED)
    assert asked == {"name": "P", "datatype": "BYTES", "shape": [1, 2]}
    assert strings([2], tensors[0]) == ["6:1", "5:2:two"]
    assert other["datatype"] == "INT32" and tensors[1] is raw


# ============================================================================ labels
def config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_label_files_are_read_line_by_line(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_bytes(b"cat\n\ndog\r\nbird\n")
    (tmp_path / "other.txt").write_bytes(b"x")
    read = read_labels(
        config(
            'name: "m" output [ { name: "A" label_filename: "labels.txt" }, '
            '{ name: "B" label_filename: "/other.txt" }, { name: "C" } ]'
        ),
        str(tmp_path),
    )
    assert read.by_output == {"A": ["cat", "", "dog\r", "bird"], "B": ["x"]}
    assert read_labels(config('name: "m"'), str(tmp_path)).serial != read.serial


def test_label_files_that_fail_the_load(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (tmp_path / "secret.txt").write_text("s\n")
    (model / "link.txt").symlink_to(tmp_path / "secret.txt")
    for name in ("../secret.txt", "link.txt"):
        with refused(
            f"label file path '{model}/{name}' for output 'A' in model 'm' is outside model "
            "directory",
            Code.UNSUPPORTED,
        ):
            read_labels(
                config(f'name: "m" output [ {{ name: "A" label_filename: "{name}" }} ]'), str(model)
            )
    with refused(
        f"failed to open text file for read {model}/none.txt: No such file or directory",
        Code.INTERNAL,
    ):
        read_labels(
            config('name: "m" output [ { name: "A" label_filename: "none.txt" } ]'), str(model)
        )


def test_an_ensemble_takes_the_labels_of_the_steps_that_write_its_outputs() -> None:
    ensemble = wiring(
        config(
            'name: "e" platform: "ensemble" input [ { name: "IN" } ] '
            'output [ { name: "OUT" }, { name: "OWN" } ] ensemble_scheduling { step [ '
            '{ model_name: "a" input_map { key: "X" value: "IN" } '
            'output_map [ { key: "Y" value: "OUT" }, { key: "Z" value: "OWN" } ] } ] }'
        )
    )
    own = Labels({"OWN": ["mine"]})
    steps = {"a": Labels({"Y": ["y0", "y1"], "Z": ["z0"]})}
    served = inherit(own, ensemble, steps, own)
    assert served.by_output == {"OWN": ["mine"], "OUT": ["y0", "y1"]}
    assert inherit(own, ensemble, steps, served) is served  # unchanged: the same serial
    assert inherit(own, ensemble, {}, served) is not served
