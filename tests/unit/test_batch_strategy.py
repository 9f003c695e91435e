"""A custom batching strategy (Triton's TRITONBACKEND_ModelBatch* library) fails its model's
load, with Triton's errors where Triton gives one; the C cases run through the real server
in tests/integration/test_c_backends.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferpool.backends.testing import BackendHarness
from inferpool.wire.errors import InferpoolError

IDENTITY = """
    name: "identity"
    backend: "identity"
    max_batch_size: 8
    {extra}
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def load_error(tmp_path: Path, extra: str) -> InferpoolError:
    with (
        pytest.raises(InferpoolError) as err,
        BackendHarness(
            "identity", IDENTITY.replace("{extra}", extra), repository_path=str(tmp_path)
        ),
    ):
        pass
    return err.value


def path_parameter(path: str) -> str:
    return f'parameters {{ key: "TRITON_BATCH_STRATEGY_PATH" value: {{ string_value: "{path}" }} }}'


def test_a_strategy_library_in_the_version_directory(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "batchstrategy.so").write_bytes(b"\x7fELF")
    err = load_error(tmp_path, "dynamic_batching { }")
    assert err.code.value == "UNSUPPORTED"
    assert f"model 'identity': the custom batching strategy in {tmp_path}/1/batchstrategy.so" in (
        err.message
    )


def test_a_strategy_path_that_does_not_exist(tmp_path: Path) -> None:
    err = load_error(tmp_path, path_parameter(f"{tmp_path}/none.so"))
    assert err.code.value == "NOT_FOUND"
    assert err.message.endswith(f": Batching library path not found: {tmp_path}/none.so")


def test_a_strategy_path_with_the_sequence_batcher(tmp_path: Path) -> None:
    err = load_error(tmp_path, "sequence_batching { } " + path_parameter("x.so"))
    assert err.code.value == "INVALID_ARG"
    assert err.message.endswith(
        "TRITON_BATCH_STRATEGY_PATH cannot be specified with sequence batcher, "
        "using default batching strategy"
    )


def test_no_strategy_loads(tmp_path: Path) -> None:
    with BackendHarness("identity", IDENTITY.replace("{extra}", ""), repository_path=str(tmp_path)):
        pass
