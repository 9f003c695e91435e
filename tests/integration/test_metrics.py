"""The Prometheus endpoint, scraped over HTTP from a real server."""

from __future__ import annotations

import re
import socket
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

from inferpool.client import InferpoolError
from tests.support import EXAMPLES, Server, free_tcp_port, identity_config, wait_until, write_model

SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], Any]:
    """Every sample as {(name, sorted labels): value (a float)}, names exactly as served,
    and every family's ``# TYPE`` as {("TYPE name", ()): type (a string)}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        text = resp.read().decode()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            samples[("TYPE " + name, ())] = kind
        elif line and not line.startswith("#"):
            match = SAMPLE.fullmatch(line)
            assert match, f"not a sample line: {line!r}"
            labels = tuple(sorted(LABEL.findall(match[2] or "")))
            samples[(match[1], labels)] = float(match[3])
    return samples


def of(model: str, **extra: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"model": model, "version": "1", **extra}.items()))


def test_metrics_count_requests_durations_and_backend_metrics(short_tmp, shm_clean) -> None:
    repo = short_tmp / "repo"
    write_model(repo, "fast", identity_config("fast"))
    write_model(
        repo,
        "slow",
        identity_config(
            "slow", extra='parameters { key: "execute_delay_ms" value: { string_value: "300" } }'
        ),
    )
    port = free_tcp_port()
    with Server(short_tmp, repo, "--metrics-port", str(port)) as server:
        with server.client() as a, server.client() as b:
            for n in range(1, 4):
                a.infer("fast", {"INPUT0": np.ones(n, np.float32)})
            # one request runs, the next waits and times out in the queue: a failure
            first = a._send(
                {
                    "type": "infer",
                    "model_name": "slow",
                    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}],
                },
                [np.ones(1, np.float32).data],
            )
            wait_until(lambda: {r["instance"]: r for r in b.status()}["slow_0"]["busy"])
            with pytest.raises(InferpoolError, match="Request timeout expired"):
                b.infer("slow", {"INPUT0": np.ones(1, np.float32)}, parameters={"timeout": 1000})
            assert "error" not in a._recv(first, 10)[0]
            # a request that does not fit the model fails too: reason OTHER
            with pytest.raises(InferpoolError, match="data-type"):
                a.infer("fast", {"INPUT0": np.ones(2, np.int64)})
            got = scrape(port)
            fast, slow = of("fast"), of("slow")
            assert got[("nv_inference_request_success", fast)] == 3
            assert got[("nv_inference_count", fast)] == 3
            assert got[("nv_inference_exec_count", fast)] == 3
            assert got[("nv_inference_request_success", slow)] == 1
            failures = {
                (labels[0][1], labels[1][1]): value  # (model, reason)
                for (name, labels), value in got.items()
                if name == "nv_inference_request_failure"
            }
            reasons = ("BACKEND", "CANCELED", "OTHER", "REJECTED")
            assert failures == {
                **{("fast", r): 0 for r in reasons},
                **{("slow", r): 0 for r in reasons},
                ("fast", "OTHER"): 1,  # the wrong datatype
                ("slow", "REJECTED"): 1,  # the queue timeout
            }
            assert got[("nv_inference_compute_infer_duration_us", slow)] >= 300_000
            assert got[("nv_inference_queue_duration_us", fast)] > 0
            # identity's custom metric: 1 + 2 + 3 FP32 elements, under the name it declared
            assert got[("input_byte_size_counter", fast)] == 24
            assert got[("inferpool_instance_ready", of("fast", instance="fast_0"))] == 1
            assert got[("inferpool_instance_restarts", of("slow", instance="slow_0"))] == 0
            assert got[("inferpool_arena_bytes", (("kind", "size"),))] == 32 << 20
            assert got[("inferpool_inflight_requests", ())] == 0
            # Triton's names and types, no _total anywhere
            assert got[("TYPE nv_inference_request_success", ())] == "counter"
            assert got[("TYPE nv_inference_request_failure", ())] == "counter"
            assert got[("TYPE inferpool_arena_bytes", ())] == "gauge"
            assert not [name for name, _ in got if name.endswith("_total")]
            with server.client() as c:  # the statistics API counts the same failures
                [stats] = c.statistics("fast")["model_stats"]
                assert stats["inference_stats"]["fail"]["count"] == 1

            a.infer("fast", {"INPUT0": np.ones(2, np.float32)})
            again = scrape(port)
            assert again[("nv_inference_request_success", fast)] == 4
            assert again[("input_byte_size_counter", fast)] == 32
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        assert err.value.code == 404
        assert server.stop() == 0


def test_a_metrics_port_in_use_is_a_clear_error(short_tmp, shm_clean) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = Server(short_tmp, EXAMPLES, "--metrics-port", str(port))
        assert server.proc.wait(30) == 1
        server.stop()
        assert f"cannot serve metrics on 127.0.0.1:{port}: Address already in use" in server.log()
