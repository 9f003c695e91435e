from __future__ import annotations

from pathlib import Path

import pytest

from inferpool.broker.models.config import load_config
from inferpool.broker.models.overrides import Override, Overrides
from inferpool.broker.models.repository import poll_failure, scan, scan_model
from inferpool.wire.errors import Code, InferpoolError
from tests.support import identity_config, write_model


def test_defaults_are_completed_as_triton_does(tmp_path) -> None:
    write_model(
        tmp_path,
        "m",
        """
        backend: "identity"
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    """,
    )
    cfg = load_config(str(tmp_path / "m"))
    assert cfg.name == "m"
    assert cfg.version_policy.latest.num_versions == 1
    assert not cfg.instance_group  # completed where the machine is known (instance_groups)


def test_platform_names_the_backend(tmp_path) -> None:
    write_model(tmp_path, "t", 'platform: "pytorch_libtorch"')
    assert load_config(str(tmp_path / "t")).backend == "pytorch"


RAGGED_IO = (
    'backend: "identity" max_batch_size: 4 '
    'input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ] '
    'output [ { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ] '
)
BATCH_IO_ERRORS = [  # Triton's ValidateBatchIO, in its words
    (
        RAGGED_IO
        + 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "S" data_type: TYPE_FP32 } ]',
        "batch input kind 'BATCH_ITEM_SHAPE' expects 1 source input, got 0 for m",
    ),
    (
        RAGGED_IO + 'batch_input [ { target_name: "S" data_type: TYPE_INT64 source_input: "A" } ]',
        "batch input data type must be TYPE_INT32 or TYPE_FP32 for m",
    ),
    (
        RAGGED_IO + 'batch_input [ { target_name: "S" data_type: TYPE_INT32 source_input: "Z" } ]',
        "unknown source input name 'Z' for m",
    ),
    (
        RAGGED_IO + 'batch_output [ { target_name: "B" source_input: [ "A", "A" ] } ]',
        "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 2 for m",
    ),
    (
        RAGGED_IO + 'batch_output [ { target_name: "B" source_input: "Z" } ]',
        "unknown source input name 'Z' for m",
    ),
    (
        RAGGED_IO + 'batch_output [ { target_name: "C" source_input: "A" } ]',
        "unknown target output name 'C' for m",
    ),
    (
        RAGGED_IO + 'batch_output [ { target_name: [ "B", "B" ] source_input: "A" } ]',
        "target output name 'B' can only be specified once for m",
    ),
]


@pytest.mark.parametrize(
    "config, message",
    [
        ('name: "other" backend: "identity"', "names the model 'other' but its directory is 'm'"),
        (
            'name: "m"',
            "Could not determine backend for model 'm' with no backend in model configuration",
        ),
        ('name: "m" backend: "identity" max_batch_size: -1', "max_batch_size must be >= 0"),
        (
            'backend: "identity" input [ { name: "A" data_type: TYPE_FP32 dims: [ 0 ] } ]',
            "has invalid dims [0]",
        ),
        ('backend: "identity" input [ { name: "A" dims: [ 1 ] } ]', "input 'A' has no data_type"),
        (
            'backend: "identity" input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, '
            '{ name: "A" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "input 'A' is declared twice",
        ),
        (
            'backend: "identity" input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 3 ] } } ]',
            "reshape [3] does not hold the same number of elements as dims [4]",
        ),
        (
            'backend: "identity" max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }',
            "preferred_batch_size 8 exceeds max_batch_size 4",
        ),
        ('backend: "identity" instance_group [ { count: -2 } ]', "has count -2"),
        ('backend: "identity" bogus_field: 3', "not a valid model configuration"),
        *BATCH_IO_ERRORS,
    ],
)
def test_config_errors_name_model_file_and_problem(tmp_path, config: str, message: str) -> None:
    write_model(tmp_path, "m", config)
    with pytest.raises(InferpoolError) as err:
        load_config(str(tmp_path / "m"))
    assert err.value.code is Code.INVALID_ARG
    assert message in err.value.message
    assert str(tmp_path / "m" / "config.pbtxt") in err.value.message


def test_missing_config_says_what_to_create(tmp_path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    entry = scan_model(str(tmp_path), "m")
    assert entry.error is not None and "config.pbtxt does not exist" in entry.error.message
    assert "or give it a <version>/model.py" in entry.error.message


@pytest.mark.parametrize("model_file, backend", [("model.py", "python"), ("model.pt", "pytorch")])
def test_without_config_the_model_file_names_the_backend(
    tmp_path, model_file: str, backend: str
) -> None:
    """As Triton: a model directory with no config.pbtxt is served by the backend its model
    file implies, which completes the rest (auto_complete_config)."""
    (tmp_path / "m" / "2").mkdir(parents=True)
    (tmp_path / "m" / "2" / model_file).write_text("")
    entry = scan_model(str(tmp_path), "m")
    assert entry.error is None and entry.versions == [2]
    assert entry.config is not None and entry.config.name == "m"
    # Triton's core names model.py; a platform it reads off model.pt leaves the name unset
    named = model_file if backend == "python" else ""
    assert entry.config.backend == backend and entry.config.default_model_filename == named


def test_a_model_directory_is_not_a_repository(tmp_path) -> None:
    model = write_model(tmp_path, "m", identity_config("m"))
    with pytest.raises(InferpoolError) as err:
        scan(str(model))
    assert err.value.code is Code.INVALID_ARG
    assert f"{model} looks like a model directory, not a model repository" in err.value.message
    assert f"such as {tmp_path}" in err.value.message


@pytest.mark.parametrize(
    "policy, expected",
    [
        ("", [3]),
        ("version_policy: { latest: { num_versions: 2 } }", [2, 3]),
        ("version_policy: { all: {} }", [1, 2, 3]),
        ("version_policy: { specific: { versions: [ 1, 3, 7 ] } }", [1, 3]),
    ],
)
def test_version_policy_selects_versions(tmp_path, policy: str, expected: list[int]) -> None:
    write_model(tmp_path, "m", identity_config("m", extra=policy), versions=(1, 2, 3))
    (tmp_path / "m" / "notaversion").mkdir()
    (tmp_path / "m" / "0").mkdir()
    assert scan_model(str(tmp_path), "m").versions == expected


def test_no_version_directory_is_the_triton_error(tmp_path) -> None:
    write_model(tmp_path, "m", identity_config("m"), versions=())
    entries = scan(str(tmp_path))
    err = entries["m"].error
    assert err is not None
    assert (
        "at least one version must be available under the version policy of model 'm'"
        in err.message
    )
    assert str(tmp_path / "m" / "1") in err.message


IO = (
    '"input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}], '
    '"output": [{"name": "Y", "data_type": "TYPE_INT32", "dims": [1]}]'
)


@pytest.mark.parametrize(
    "where, backend",
    [
        ("1/model.py", "python"),
        ("1/model.onnx", "onnxruntime"),
        ("1/model.pt", "pytorch"),
        ("1/model.xml", "openvino"),
        ("1/libtriton_accumulate.so", "accumulate"),
        ("libtriton_repeat.so", "repeat"),
    ],
)
def test_a_config_override_without_backend_takes_it_from_the_models_files(
    tmp_path, where: str, backend: str
) -> None:
    """As Triton: the override names no backend, the model's files imply it."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / where).write_text("")
    overrides = Overrides(str(tmp_path))
    overrides.use("m", Override("{" + IO + ', "max_batch_size": 4}'))
    entry = overrides.scan("m")
    assert entry.error is None and entry.config is not None, entry.error
    assert (entry.config.backend, entry.config.max_batch_size) == (backend, 4)
    named = {"onnxruntime": "model.onnx", "openvino": "model.xml", "python": "model.py"}.get(
        backend, ""
    )
    assert entry.config.default_model_filename == named  # as Triton's core completes it
    # the same model given as files: its own directory, config.pbtxt the completed config
    overrides.use("n", Override("{" + IO + "}", {where: b"", "1/README": b""}))
    written = overrides.scan("n")
    assert written.error is None and written.config is not None
    assert written.config.backend == backend
    assert f'backend: "{backend}"' in (Path(written.path) / "config.pbtxt").read_text()
    overrides.close()


def test_an_override_naming_no_backend_its_files_do_not_imply_is_refused(tmp_path) -> None:
    (tmp_path / "m" / "1").mkdir(parents=True)
    overrides = Overrides(str(tmp_path))
    overrides.use("m", Override("{" + IO + "}"))
    err = overrides.scan("m").error
    assert err is not None and "Could not determine backend for model 'm'" in err.message


def test_a_model_not_in_the_repository_is_named_without_the_servers_paths(tmp_path) -> None:
    entry = scan_model(str(tmp_path), "nosuch")
    assert entry.error is not None and entry.error.code is Code.NOT_FOUND
    assert entry.error.message == "model 'nosuch' not found in any model repository"
    answer = poll_failure("nosuch", entry.error)
    assert answer.code is Code.INTERNAL and str(tmp_path) not in answer.message
    assert answer.message.startswith(
        "failed to load 'nosuch', failed to poll from model repository: "
    )
