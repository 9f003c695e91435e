"""The response cache, the statistics Triton adds to a model's (cache hits and misses, response
statistics of decoupled models, memory usage), outputs in the config's dims after a
reshape, and load warnings for config fields the server ignores: one real server."""

from __future__ import annotations

import os
import re
import secrets
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.shm.region import Region
from tests.integration.pytorch_support import serving
from tests.support import free_tcp_port, identity_config, write_model

CACHED = "response_cache { enable: true }"
TWO_IO = """
    name: "pair" backend: "identity" max_batch_size: 0 response_cache { enable: true }
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
            { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
             { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""
RESHAPED = """
    name: "reshaped" backend: "identity" max_batch_size: 2
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
"""
STREAM_PY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for i in range(2):
                out = pb_utils.Tensor("OUT", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
STREAM = """
    name: "%s" backend: "python" model_transaction_policy { decoupled: true } %s
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
# an ensemble whose answers are cached: a hit runs none of its steps (as Triton's top-level
# ensemble caching)
MEMO = """
    name: "memo" platform: "ensemble" response_cache { enable: true }
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
    ensemble_scheduling { step [ { model_name: "ordered" input_map { key: "INPUT0" value: "IN" }
                                   output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
# a backend whose instances report memory, as TRITONBACKEND_ModelInstanceReportMemoryUsage
REPORTER = """
from inferpool.backends.api import Backend, Model, ModelInstance


class Instance(ModelInstance):
    def initialize(self):
        self.report_memory_usage("CPU", 1000)
        self.report_memory_usage("GPU", 24, device_id=1)

    def execute(self, requests):
        return [request.response() for request in requests]


class Reporter(Backend):
    model_class = Model
    instance_class = Instance


BACKEND = Reporter
"""
PORT = free_tcp_port()


def build(repo: Path) -> None:
    write_model(repo, "cached", identity_config("cached", extra=CACHED))
    write_model(repo, "big", identity_config("big", datatype="TYPE_UINT8", extra=CACHED))
    write_model(repo, "pair", TWO_IO)
    write_model(repo, "reshaped", RESHAPED)
    write_model(repo, "stream", STREAM % ("stream", ""), files={"1/model.py": STREAM_PY})
    write_model(
        repo, "stream_cached", STREAM % ("stream_cached", CACHED), files={"1/model.py": STREAM_PY}
    )
    write_model(
        repo,
        "ordered",
        identity_config("ordered", extra="dynamic_batching { preserve_ordering: true }"),
    )
    write_model(repo, "memo", MEMO)
    reporter = identity_config("reporter", extra="instance_group [ { count: 2 kind: KIND_CPU } ]")
    reporter = reporter.replace('"identity"', '"reporter"')
    write_model(repo, "reporter", reporter, files={"reporter.py": REPORTER})


@pytest.fixture(scope="module")
def server() -> Iterator:
    args = ("--cache-size", "1M", "--metrics-port", str(PORT), "--exit-on-error=false")
    with serving(build, *args) as s:  # stream_cached cannot load, by design
        yield s


def stats(c, model: str) -> dict:
    return c.statistics(model)["model_stats"][0]


def counts(c, model: str) -> tuple[int, int, int, int]:
    """(successes, cache hits, cache misses, executions)."""
    s = stats(c, model)
    inference = s["inference_stats"]
    return (
        inference["success"]["count"],
        inference["cache_hit"]["count"],
        inference["cache_miss"]["count"],
        s["execution_count"],
    )


def infer_raw(c, model: str, arrays: dict[str, np.ndarray], outputs=None, **parameters) -> tuple:
    """One request as the protocol has it: (header, frames) of the answer."""
    header = {
        "type": "infer",
        "model_name": model,
        "inputs": [
            {
                "name": n,
                "datatype": "FP32" if a.dtype == np.float32 else "UINT8",
                "shape": list(a.shape),
            }
            for n, a in arrays.items()
        ],
        "parameters": parameters,
    }
    if outputs is not None:
        header["outputs"] = outputs
    reply, frames = c._recv(c._send(header, [a.data for a in arrays.values()]), 30)
    assert "error" not in reply, reply
    return reply, frames


# ============================================================================ the cache
def test_a_hit_is_answered_without_running_the_model(server) -> None:
    x = np.arange(5, dtype=np.float32)
    with server.client() as c:
        answers = [infer_raw(c, "cached", {"INPUT0": x}) for _ in range(3)]
        assert counts(c, "cached") == (3, 2, 1, 1)
        first_header, first_frames = answers[0]
        for header, frames in answers[1:]:
            assert header["outputs"] == first_header["outputs"]
            assert header["parameters"] == first_header["parameters"]  # param0..3 too
            assert [bytes(f.buffer) for f in frames] == [bytes(f.buffer) for f in first_frames]
        assert np.array_equal(c.infer("cached", {"INPUT0": x})["OUTPUT0"], x)
        s = stats(c, "cached")
        assert s["inference_count"] == 1  # hits are not inferences
        assert s["inference_stats"]["cache_hit"]["ns"] > 0


def test_an_ensembles_hit_runs_none_of_its_steps(server) -> None:
    x = np.arange(3, dtype=np.float32)
    with server.client() as c:
        step_before = stats(c, "ordered")["inference_stats"]["success"]["count"]
        answers = [c.infer("memo", {"IN": x})["OUT"].tolist() for _ in range(3)]
        assert answers == [x.tolist()] * 3
        assert counts(c, "memo")[:3] == (3, 2, 1)
        assert stats(c, "ordered")["inference_stats"]["success"]["count"] == step_before + 1


def test_the_key_holds_everything_a_model_can_read(server) -> None:
    x, y = np.ones(3, np.float32), np.zeros(3, np.float32)
    with server.client() as c:
        base = counts(c, "pair")
        infer_raw(c, "pair", {"INPUT0": x, "INPUT1": y})
        infer_raw(c, "pair", {"INPUT0": y, "INPUT1": x})  # other bytes
        infer_raw(c, "pair", {"INPUT0": x, "INPUT1": y}, [{"name": "OUTPUT0"}])  # other outputs
        infer_raw(c, "pair", {"INPUT0": x, "INPUT1": y}, flavour="salty")  # other parameters
        infer_raw(c, "pair", {"INPUT1": y, "INPUT0": x})  # the same request, inputs reordered
        infer_raw(c, "pair", {"INPUT0": x, "INPUT1": y}, sequence_id=7)  # a sequence's: not cached
        success, hits, misses, executions = counts(c, "pair")
        assert (success - base[0], hits - base[1], misses - base[2]) == (6, 1, 4)
        assert executions - base[3] == 5


def test_a_hit_can_be_served_as_an_output_handle(server) -> None:
    x = np.arange(7, dtype=np.float32)
    handle = [{"name": "OUTPUT0", "parameters": {"output_handle": True}}]
    with server.client() as c:
        infer_raw(c, "cached", {"INPUT0": x})  # stored
        for _ in range(2):  # the entry serves a handle, and again after its release
            reply, frames = infer_raw(c, "cached", {"INPUT0": x}, handle)
            params = reply["outputs"][0]["parameters"]
            assert frames == [] and params["handle_region"].endswith("-cache")
            region = Region.attach(params["handle_region"], readonly=True)
            try:
                got = region.view(params["handle_offset"], params["handle_byte_size"])
                assert bytes(got) == x.tobytes()
            finally:
                region.close()
            assert c.call("release_leases", leases=[params["handle_lease"]])["released"] == 1


def test_requests_using_a_clients_shared_memory_run_as_without_a_cache(server) -> None:
    x = np.arange(8, dtype=np.float32)
    region = Region.create(f"ipt-{os.getpid()}-{secrets.token_hex(3)}", 4096, prefault=False)
    window = {"shared_memory_region": "mine", "shared_memory_byte_size": x.nbytes}
    try:
        np.frombuffer(region.buf, np.float32, 8)[:] = x
        with server.client() as c:
            c.call("register_system_shared_memory", name="mine", key=region.name, byte_size=4096)
            infer_raw(c, "cached", {"INPUT0": x})  # stored from frames
            before = counts(c, "cached")
            for inputs, frames, outputs in (
                (
                    [{"name": "INPUT0", "datatype": "FP32", "shape": [8], "parameters": window}],
                    [],
                    None,
                ),
                (
                    [{"name": "INPUT0", "datatype": "FP32", "shape": [8]}],
                    [x.data],
                    [{"name": "OUTPUT0", "parameters": {**window, "shared_memory_offset": 64}}],
                ),
            ):
                header: dict[str, Any] = {"type": "infer", "model_name": "cached"}
                header["inputs"] = inputs
                if outputs:
                    header["outputs"] = outputs
                reply, _ = c._recv(c._send(header, frames), 30)
                assert "error" not in reply, reply
            success, hits, misses, executions = counts(c, "cached")
            assert (success, hits, misses) == (before[0] + 2, before[1], before[2])
            assert executions == before[3] + 2  # both ran
            np.testing.assert_array_equal(np.frombuffer(region.buf, np.float32, 8, 64), x)
            c.call("unregister_system_shared_memory", name="mine")
    finally:
        region.destroy()


def test_the_cache_is_bounded_by_its_size_and_evicts_the_least_recently_used(server) -> None:
    chunk = 300_000  # three fit in 1 MiB
    with server.client() as c:
        blocks = [np.full(chunk, i, np.uint8) for i in range(5)]
        for block in blocks:
            infer_raw(c, "big", {"INPUT0": block})
        infer_raw(c, "big", {"INPUT0": blocks[0]})  # evicted: a miss again
        infer_raw(c, "big", {"INPUT0": blocks[4]})  # still there: a hit
        _success, hits, misses, _executions = counts(c, "big")
        assert (hits, misses) == (1, 6)
        metrics = scrape()
        assert metrics["nv_cache_num_evictions"] >= 3
        assert 0 < metrics["nv_cache_util"] <= 1.0
        assert metrics["nv_cache_num_entries"] <= 5
        assert metrics[('nv_cache_num_hits_per_model{model="big",version="1"}')] == 1
        assert metrics[('nv_cache_num_misses_per_model{model="big",version="1"}')] == 6
        assert 'nv_cache_num_hits_per_model{model="pair",version="1"}' in metrics
        assert not any('model="stream"' in k and k.startswith("nv_cache") for k in metrics)


def scrape() -> dict[str, float]:
    """Samples by name and labels, a counter's ``_total`` suffix (if any) dropped."""
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            samples[re.sub(r"_total(?=\{|$)", "", key)] = float(value)
    return samples


def test_a_decoupled_model_cannot_enable_the_cache(server) -> None:
    with server.client() as c:
        row = next(r for r in c.models() if r["name"] == "stream_cached")
        assert row["state"] == "UNAVAILABLE"
        assert (
            "Response Cache does not currently support model stream_cached with 'decoupled'"
            in row["reason"]
        )


# ============================================================================ statistics
def test_a_decoupled_models_responses_have_statistics_by_index(server) -> None:
    with server.client() as c:
        for _ in range(3):
            got = [r.outputs["OUT"][0] for r in c.stream("stream", {"IN": np.zeros(1, np.int32)})]
            assert got == [0, 1]
        responses = stats(c, "stream")["response_stats"]
    assert sorted(responses) == ["0", "1", "2"]
    for key in ("0", "1"):
        assert responses[key]["success"]["count"] == 3
        assert responses[key]["compute_infer"]["count"] == 3
        assert responses[key]["compute_output"]["count"] == 3
        assert responses[key]["fail"]["count"] == 0
    assert responses["2"]["empty_response"]["count"] == 3  # the final flag alone
    assert responses["2"]["success"]["count"] == 0


def test_memory_usage_is_what_the_instances_report_summed(server) -> None:
    with server.client() as c:
        assert stats(c, "reporter")["memory_usage"] == [
            {"type": "CPU", "id": 0, "byte_size": 2000},  # two instances (the config's count)
            {"type": "GPU", "id": 1, "byte_size": 48},
        ]
        assert stats(c, "cached")["memory_usage"] == []  # identity reports none


def test_outputs_come_back_in_the_configs_dims_after_a_reshape(server) -> None:
    x = np.arange(8, dtype=np.int32).reshape(2, 4)
    with server.client() as c:
        out = c.infer("reshaped", {"INPUT0": x})["OUTPUT0"]
    assert out.shape == (2, 4)  # the backend saw and produced [2, 2, 2]
    np.testing.assert_array_equal(out, x)


def test_a_config_field_the_server_ignores_is_named_in_a_load_warning(server) -> None:
    log = server.log()
    assert (
        "model 'ordered': config field 'dynamic_batching.preserve_ordering' is not implemented "
        "by inferpool and is ignored" in log
    )
    with server.client() as c:
        assert c.is_model_ready("ordered")
