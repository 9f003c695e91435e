"""Ensemble configurations checked as Triton checks them, with Triton's messages: the wiring
when config.pbtxt is read, the composing models' served configs once they have loaded."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.config import load_config
from inferpool.broker.models.ensemble_config import check_composing, wiring
from inferpool.wire.errors import Code, InferpoolError
from tests.support import write_model

IO = """
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], extra: str = "") -> str:
    ins = " ".join(f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = " ".join(f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" {extra} {ins} {outs} }}'


def ensemble(*steps: str, io: str = IO, name: str = "e", extra: str = "") -> str:
    return f"""
        name: "{name}"
        platform: "ensemble"
        {extra}
        {io}
        ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
    """


def parse(text: str) -> pb.ModelConfig:
    return text_format.Parse(textwrap.dedent(text), pb.ModelConfig())


def model(name: str, ins: str, outs: str, extra: str = "") -> pb.ModelConfig:
    return parse(f'name: "{name}" backend: "identity" {extra} input [ {ins} ] output [ {outs} ]')


def tensor(name: str, dims: str = "[ 4 ]", dtype: str = "TYPE_FP32", extra: str = "") -> str:
    return f'{{ name: "{name}" data_type: {dtype} dims: {dims} {extra} }}'


CHAIN = ensemble(
    step("a", {"X": "IN"}, {"Y": "mid"}),
    step("b", {"X": "mid"}, {"Y": "OUT"}, "model_version: 2"),
)


def test_a_chain_is_wired_with_its_readers(tmp_path: Path) -> None:
    write_model(tmp_path, "e", CHAIN)
    config = load_config(str(tmp_path / "e"))
    assert config.backend == "" and not config.instance_group  # nothing completed for it
    found = wiring(config)
    assert [(s.model_name, s.model_version) for s in found.steps] == [("a", -1), ("b", 2)]
    assert found.readers == {"IN": (0,), "mid": (1,)}
    assert found.models() == ["a", "b"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            'name: "e" backend: "identity" ensemble_scheduling { step [] }',
            "ensemble scheduling cannot be set for model 'e' whose platform is not ensemble",
        ),
        (
            'name: "e" platform: "ensemble"',
            "ensemble scheduling must be set for ensemble e whose platform is ensemble",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "OUT"}), extra='backend: "python"'),
            "Ensemble model 'e' must have platform type 'ensemble' and empty backend type",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "OUT"}), extra="instance_group [ { count: 2 } ]"),
            "instance group should not be specified for ensemble 'e'",
        ),
        (ensemble(), "must specify 'step' for ensemble 'e'"),
        (ensemble('{ input_map { key: "X" value: "IN" } }'), "must specify 'model_name' in step 0"),
        (ensemble(step("a", {}, {"Y": "OUT"})), "must specify 'input_map' in step 0"),
        (ensemble(step("a", {"X": "IN"}, {})), "must specify 'output_map' in step 0"),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "OUT"}), step("b", {"X": "IN"}, {"Y": "OUT"})),
            "ensemble tensor 'OUT' can appear in an output map only once for ensemble 'e' step 1",
        ),
        (
            ensemble(step("a", {"X": "other"}, {"Y": "OUT"})),
            "ensemble input 'IN' for ensemble 'e' is not used",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "mid"})),
            "ensemble output 'OUT' for ensemble 'e' is not used",
        ),
        (  # a cycle: 'loop' needs 'OUT', which needs 'loop'
            ensemble(
                step("a", {"X": "IN"}, {"Y": "side"}),
                step("b", {"X": "loop", "Z": "side"}, {"Y": "OUT"}),
                step("c", {"X": "OUT"}, {"Y": "loop"}),
            ),
            "output 'OUT' for ensemble 'e' is not written: at least one of its depending "
            "tensors, 'loop', is not connected",
        ),
        (
            ensemble(step("a", {"X": "IN"}, {"Y": "OUT", "Z": "spare"})),
            "ensemble tensor 'spare' is unused in ensemble 'e'",
        ),
        (
            ensemble(
                step("a", {"X": "IN"}, {"Y": "OUT"}),
                io='input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] output [ { name: '
                '"OUT" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "IN" data_type: TYPE_FP32 '
                "dims: [ 4 ] } ]",
            ),
            "ensemble output 'IN' for ensemble 'e' is one of its inputs: map it through a step",
        ),
    ],
)
def test_wiring_errors_read_as_triton_words_them(tmp_path: Path, config: str, message: str) -> None:
    write_model(tmp_path, "e", config)
    with pytest.raises(InferpoolError) as err:
        load_config(str(tmp_path / "e"))
    assert err.value.code is Code.INVALID_ARG
    assert message in err.value.message
    assert str(tmp_path / "e" / "config.pbtxt") in err.value.message  # names the file


AB = {
    "a": model("a", tensor("X"), tensor("Y")),
    "b": model("b", tensor("X"), tensor("Y")),
}


def test_composing_models_that_fit_the_wiring() -> None:
    config = parse(CHAIN)
    assert check_composing(wiring(config), config, AB) is False
    streaming = {**AB, "a": parse(f"{AB['a']} model_transaction_policy {{ decoupled: true }}")}
    assert check_composing(wiring(config), config, streaming) is True  # the ensemble streams


@pytest.mark.parametrize(
    ("composing", "message"),
    [
        (
            {"a": model("a", tensor("W"), tensor("Y"))},
            "in ensemble e, ensemble tensor IN is mapping to non-existing input X in model a",
        ),
        (
            {"a": model("a", f"{tensor('X')}, {tensor('V')}", tensor("Y"))},
            "in ensemble e, input V in model a is not mapped to any ensemble tensors",
        ),
        (
            {"a": model("a", tensor("X"), tensor("W"))},
            "in ensemble e, ensemble tensor mid is mapped from non-existing output Y in model a",
        ),
        (
            {"b": model("b", tensor("X", dtype="TYPE_INT32"), tensor("Y"))},
            "in ensemble e, ensemble tensor mid: inconsistent data type: TYPE_FP32 is inferred "
            "from model a while TYPE_INT32 is inferred from model b",
        ),
        (
            {"b": model("b", tensor("X", "[ 8 ]"), tensor("Y"))},
            "in ensemble e, ensemble tensor mid: inconsistent shape: [4] is inferred from model "
            "a while [8] is inferred from model b",
        ),
    ],
)
def test_composing_errors_read_as_triton_words_them(
    composing: dict[str, pb.ModelConfig], message: str
) -> None:
    config = parse(CHAIN)
    with pytest.raises(InferpoolError) as err:
        check_composing(wiring(config), config, {**AB, **composing})
    assert err.value.code is Code.INVALID_ARG and message in err.value.message


def test_an_optional_input_may_stay_unmapped_and_batch_sizes_must_fit() -> None:
    config = parse(CHAIN)
    optional = model("a", f"{tensor('X')}, {tensor('V', extra='optional: true')}", tensor("Y"))
    assert check_composing(wiring(config), config, {**AB, "a": optional}) is False
    batched = parse(CHAIN.replace('platform: "ensemble"', 'platform: "ensemble" max_batch_size: 8'))
    small = {name: parse(f"{cfg} max_batch_size: 4") for name, cfg in AB.items()}
    with pytest.raises(InferpoolError, match="ensemble e allows maximum batch size 8, but it "):
        check_composing(wiring(batched), batched, small)
    # a non-batching model may sit in a batching ensemble when the full shapes agree
    unbatched = {**small, "a": model("a", tensor("X", "[ -1, 4 ]"), tensor("Y", "[ -1, 4 ]"))}
    big = {**unbatched, "b": parse(f"{AB['b']} max_batch_size: 8")}
    assert check_composing(wiring(batched), batched, big) is False


def test_steps_reading_different_streams_are_refused() -> None:
    config = parse(
        ensemble(
            step("a", {"X": "IN"}, {"Y": "s1"}),
            step("b", {"X": "IN"}, {"Y": "s2"}),
            step("c", {"X": "s1", "Z": "s2"}, {"Y": "OUT"}),
        )
    )
    stream = "model_transaction_policy { decoupled: true }"
    composing = {
        "a": model("a", tensor("X"), tensor("Y"), stream),
        "b": model("b", tensor("X"), tensor("Y")),
        "c": model("c", f"{tensor('X')}, {tensor('Z')}", tensor("Y")),
    }
    with pytest.raises(InferpoolError) as err:
        check_composing(wiring(config), config, composing)
    assert (
        "in ensemble e, step of model 'c' receives inputs originated from different decoupled "
        "models" in err.value.message
    )
