"""The example repository served for real: inference, metadata, statistics, any client."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError
from tests.support import ROOT, Server


def test_identity_round_trip_over_ipc_and_tcp(example_server: Server) -> None:
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    for endpoint in example_server.endpoints:
        with Client(endpoint, timeout=10) as c:
            result = c.infer_result("identity", {"INPUT0": x})
            np.testing.assert_array_equal(result.outputs["OUTPUT0"], x)
            assert result.model_version == "1"
            assert result.parameters == {
                "param0": "an example string parameter",
                "param1": 42,
                "param2": False,
                "param3": 123.123,
            }


def test_batched_bytes_and_optional_input(example_server: Server) -> None:
    with example_server.client() as c:
        ints = np.arange(12, dtype=np.int32).reshape(3, 4)
        words = np.array([[b"alpha"], [b""], ["\u00fcnicode".encode()]], dtype=object)
        out = c.infer("identity_batched", {"INPUT0": ints, "INPUT1": words})
        np.testing.assert_array_equal(out["OUTPUT0"], ints)
        assert out["OUTPUT1"].tolist() == words.tolist()
        # INPUT1 is optional: its output comes back as zeros (empty strings) of the batch size
        out = c.infer("identity_batched", {"INPUT0": ints[:2]})
        assert out["OUTPUT1"].shape == (2, 1) and out["OUTPUT1"].tolist() == [[b""], [b""]]
        # only the requested outputs are produced
        out = c.infer("identity_batched", {"INPUT0": ints}, outputs=["OUTPUT0"])
        assert list(out) == ["OUTPUT0"]


def test_metadata_config_index_and_health(example_server: Server) -> None:
    with example_server.client() as c:
        assert c.is_live() and c.is_ready()
        assert c.is_model_ready("identity")
        with pytest.raises(
            InferpoolError, match="'identity_batched' version 7 is not found"
        ) as err:
            c.is_model_ready("identity_batched", 7)
        assert err.value.code.value == "NOT_FOUND"
        meta = c.model_metadata("identity_batched")
        assert meta["versions"] == ["1"] and meta["platform"] == "identity"
        assert meta["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, -1]}
        assert c.model_config("identity_batched")["max_batch_size"] == 8
        assert c.model_config("identity")["backend"] == "identity"
        index = {(m["name"], m["version"]): m["state"] for m in c.models()}
        assert index == {
            ("add_sub", "1"): "READY",
            ("identity", "1"): "READY",
            ("identity_batched", "1"): "READY",
            ("square_int32", "1"): "READY",
        }
        server = c.server_metadata()
        assert server["name"] == "triton" and server["protocol"] == 1  # Triton's default


def test_statistics_count_requests_and_batches(example_server: Server) -> None:
    def numbers(stats: dict) -> tuple[int, ...]:
        [s] = stats["model_stats"]
        inference = s["inference_stats"]
        [metric] = [m for m in stats["custom_metrics"] if m["family"] == "input_byte_size_counter"]
        assert metric["labels"] == {"model": "identity", "version": "1"}
        return (
            inference["success"]["count"],
            inference["fail"]["count"],
            s["execution_count"],
            s["inference_count"],
            inference["queue"]["count"],
            int(metric["value"]),
        )

    with example_server.client() as c:
        before = numbers(c.statistics("identity"))
        for _ in range(5):
            c.infer("identity", {"INPUT0": np.ones(8, np.float32)})
        with pytest.raises(InferpoolError):
            c.infer("identity", {"INPUT0": np.ones(8, np.int32)})  # wrong datatype: not admitted
        stats = c.statistics("identity")
    after = numbers(stats)
    # 5 successes, 1 failure (counted, as Triton counts it), 5 executions of 32 bytes each
    assert [a - b for a, b in zip(after, before, strict=True)] == [5, 1, 5, 5, 5, 5 * 32]
    [s] = stats["model_stats"]
    assert s["inference_stats"]["compute_infer"]["ns"] > 0
    assert [b["batch_size"] for b in s["batch_stats"]] == [1]


def test_dynamic_batcher_groups_concurrent_requests(short_tmp, shm_clean) -> None:
    from tests.support import identity_config, write_model

    repo = short_tmp / "repo"
    write_model(
        repo,
        "slow",
        identity_config(
            "slow",
            "TYPE_INT32",
            max_batch=8,
            extra="""dynamic_batching { max_queue_delay_microseconds: 200000 }
                 instance_group [ { count: 1 kind: KIND_CPU } ]
                 parameters { key: "execute_delay_ms" value: { string_value: "100" } }""",
        ),
    )
    with Server(short_tmp, repo) as server:
        clients = [server.client() for _ in range(4)]
        try:
            ids = [
                c._send(
                    {
                        "type": "infer",
                        "model_name": "slow",
                        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 2]}],
                    },
                    [np.array([[i, i]], np.int32).data],
                )
                for i, c in enumerate(clients)
            ]
            for i, (c, rid) in enumerate(zip(clients, ids, strict=True)):
                header, frames = c._recv(rid, 10)
                assert "error" not in header, header
                assert np.frombuffer(frames[0].buffer, np.int32).tolist() == [i, i]
            stats = clients[0].statistics("slow")["model_stats"][0]
        finally:
            for c in clients:
                c.close()
    # four requests, fewer executions: the batcher grouped the ones that queued together
    assert stats["inference_count"] == 4
    assert stats["execution_count"] < 4
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 1


def test_cli_infer_and_models(example_server: Server) -> None:
    run = [sys.executable, "-m", "inferpool"]
    ep = ["--endpoint", example_server.endpoint]
    out = subprocess.run(
        [*run, "infer", "identity", "--input", "INPUT0=1,2,3", *ep],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "OUTPUT0 FP32 [3]: [1.0, 2.0, 3.0]" in out
    out = subprocess.run(
        [*run, "infer", "add_sub", "--input", "INPUT0=1,2,3,4", "--input", "INPUT1=4,3,2,1", *ep],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert (
        out == "OUTPUT0 FP32 [4]: [5.0, 5.0, 5.0, 5.0]\nOUTPUT1 FP32 [4]: [-3.0, -1.0, 1.0, 3.0]\n"
    )
    out = subprocess.run(
        [
            *run,
            "infer",
            "identity_batched",
            "--input",
            "INPUT0=1,2,3,4",
            "--shape",
            "2x2",
            "--output",
            "OUTPUT0",
            "--json",
            *ep,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert '"outputs": {"OUTPUT0": [[1, 2], [3, 4]]}' in out
    bad = subprocess.run(
        [*run, "infer", "identity", "--input", "INPUT0=1,2,3,4", "--shape", "2x2", *ep],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert (
        "unexpected shape for input 'INPUT0' for model 'identity'. Expected [-1], got [2,2]"
        in bad.stderr
    )
    out = subprocess.run(
        [*run, "models", *ep], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert "identity_batched" in out and "READY" in out
    bad = subprocess.run(
        [*run, "infer", "nosuch", "--input", "INPUT0=1", *ep],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "NOT_FOUND" in bad.stderr and "nosuch" in bad.stderr


@pytest.mark.skipif(
    not os.path.exists("/usr/include/zmq.h"),
    reason="libzmq3-dev is not installed (apt-get install libzmq3-dev)",
)
def test_c_client_speaks_the_protocol(example_server: Server) -> None:
    cdir = ROOT / "scripts" / "clients" / "c"
    build = subprocess.run(["make", "-C", str(cdir)], capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr
    assert "warning" not in build.stderr
    binary = str(cdir / "infer_identity")
    for endpoint in example_server.endpoints:
        run = subprocess.run(
            [binary, endpoint, "identity"], capture_output=True, text=True, timeout=30
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout == "OUTPUT0 = 1.5 2.5 3.5 4.5\nOK\n"
    missing = subprocess.run(
        [binary, example_server.endpoint, "missing"], capture_output=True, text=True, timeout=30
    )
    assert missing.returncode == 2 and "server error NOT_FOUND" in missing.stderr
    health = subprocess.run(
        [binary, example_server.endpoint, "identity", "--health"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert health.returncode == 0 and health.stdout.strip() == "true"
    lane = subprocess.run(
        [binary, example_server.endpoint, "identity", "--lane"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert lane.returncode == 0, lane.stderr
    assert lane.stdout == "OUTPUT0 = 1.5 2.5 3.5 4.5\nOK (lane)\n"
    refused = subprocess.run(
        [binary, example_server.endpoint, "identity_batched", "--lane"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2 and "server error UNSUPPORTED" in refused.stderr
