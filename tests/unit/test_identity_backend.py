"""The identity backend through the real lifecycle host, in process."""

from __future__ import annotations

import time

import numpy as np
import pytest

from inferpool.backends.testing import BackendHarness
from inferpool.wire.errors import Code, InferpoolError
from tests.support import identity_config

PAIRS = """
    name: "id"
    backend: "identity"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ 2, -1 ] optional: true } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 2, -1 ] } ]
"""


def test_outputs_copy_inputs_and_carry_the_seed_parameters() -> None:
    with BackendHarness("identity", PAIRS) as h:
        x = np.arange(6, dtype=np.int32).reshape(2, 3)
        y = np.ones((2, 2, 5), np.float32)
        [(_, response, final)] = h.execute([h.request({"INPUT0": x, "INPUT1": y})])
        out = h.outputs_of(response)
        np.testing.assert_array_equal(out["OUTPUT0"], x)
        np.testing.assert_array_equal(out["OUTPUT1"], y)
        assert response is not None
        assert final and response.parameters == {
            "param0": "an example string parameter",
            "param1": 42,
            "param2": False,
            "param3": 123.123,
        }


def test_optional_input_missing_gives_zeros_with_the_batch_dimension() -> None:
    with BackendHarness("identity", PAIRS) as h:
        out = h.infer({"INPUT0": np.ones((3, 2), np.int32)})
        assert out["OUTPUT1"].shape == (3, 2, 1) and not out["OUTPUT1"].any()


def test_only_requested_outputs_are_produced() -> None:
    with BackendHarness("identity", PAIRS) as h:
        out = h.infer({"INPUT0": np.ones((1, 2), np.int32)}, outputs=["OUTPUT0"])
        assert list(out) == ["OUTPUT0"]


def test_a_bad_request_does_not_sink_the_batch() -> None:
    config = PAIRS.replace("optional: true", "")
    with BackendHarness("identity", config) as h:
        good = h.request(
            {"INPUT0": np.ones((1, 2), np.int32), "INPUT1": np.ones((1, 2, 1), np.float32)}
        )
        bad = h.request({"INPUT0": np.ones((1, 2), np.int32)})  # OUTPUT1 wanted, INPUT1 absent
        results = {id(r): resp for r, resp, _ in h.execute([good, bad]) if resp is not None}
        assert results[id(good)].error is None
        err = results[id(bad)].error
        assert err is not None and err.code is Code.UNSUPPORTED
        assert err.message == "failed to get input 'INPUT1'"
        assert not results[id(bad)].outputs  # the partial output was given back


@pytest.mark.parametrize(
    "config, message",
    [
        (
            identity_config("x").replace("OUTPUT0", "OUT0"),
            "expected output name to follow OUTPUT<index> pattern, got 'OUT0'",
        ),
        (
            identity_config("x").replace("INPUT0", "IN0"),
            "expected input name to follow INPUT<index> pattern, got 'IN0'",
        ),
        (
            identity_config("x").replace(
                'name: "OUTPUT0" data_type: TYPE_FP32', 'name: "OUTPUT0" data_type: TYPE_INT8'
            ),
            "expected input and output datatype to match, got TYPE_FP32 and TYPE_INT8",
        ),
        (
            identity_config("x").replace(
                'name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ]',
                'name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ]',
            ),
            "expected input and output shape to match, got [-1] and [3]",
        ),
        (
            identity_config("x").replace('name: "OUTPUT0"', 'name: "OUTPUT1"'),
            "expected input and output indices to match",
        ),
        (
            'name: "x" backend: "identity" input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]',
            "model configuration must have equal input/output pairs",
        ),
        (
            identity_config(
                "x", extra='parameters { key: "execute_delay_ms" value: { string_value: "soon" } }'
            ),
            "parameter 'execute_delay_ms' of model 'x': failed to convert 'soon' to integral number",
        ),
    ],
)
def test_config_validation_uses_the_seed_messages(config: str, message: str) -> None:
    with pytest.raises(InferpoolError) as err:
        BackendHarness("identity", config)
    assert message in err.value.message
    assert "TRITONBACKEND_ModelInitialize (Model.initialize) failed" in err.value.message


def test_reshape_is_compared_instead_of_dims() -> None:
    config = identity_config("x", dims="[ 4 ]").replace(
        "dims: [ 4 ] }", "dims: [ 4 ] reshape: { shape: [ 2, 2 ] } }"
    )
    with BackendHarness("identity", config) as h:
        assert h.host.model is not None


def test_gpu_instances_are_refused_by_the_cpu_identity() -> None:
    with pytest.raises(InferpoolError, match="'identity' backend only supports CPU instances"):
        BackendHarness("identity", identity_config("x"), instance={"name": "x_0", "kind": "GPU"})


def test_execute_delay_and_instance_multiplier() -> None:
    config = identity_config(
        "x",
        extra="""parameters [
        { key: "execute_delay_ms" value: { string_value: "30" } },
        { key: "instance_wise_delay_multiplier" value: { string_value: "2" } } ]""",
    )
    with BackendHarness(
        "identity", config, instance={"name": "x_0_1", "kind": "CPU", "index": 2}
    ) as h:
        start = time.monotonic()
        h.infer({"INPUT0": np.ones(2, np.float32)})
        assert time.monotonic() - start >= 0.03 * 2 * 2  # delay * multiplier * instance index


def test_creation_delay_holds_the_model_load() -> None:
    config = identity_config(
        "x", extra='parameters { key: "creation_delay_sec" value: { string_value: "1" } }'
    )
    start = time.monotonic()
    with BackendHarness("identity", config) as h:
        assert time.monotonic() - start >= 1.0
        assert h.host.model is not None


def test_statistics_and_metric_are_reported() -> None:
    with BackendHarness("identity", PAIRS) as h:
        reqs = [
            h.request({"INPUT0": np.ones((2, 3), np.int32)}, outputs=["OUTPUT0"]) for _ in range(2)
        ]
        h.execute(reqs)
        assert all(h.host.timing_of(r) is not None for r in reqs)
        [(batch_size, *_)] = h.host.take_batches()
        assert batch_size == 4
        update = h.host.stats.drain_metrics()
        assert update is not None
        assert [op.value for op in update.ops] == [48]  # folded per metric until the batch is sent
