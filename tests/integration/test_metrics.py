"""The Prometheus endpoint, scraped over HTTP from a real server."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferpool.client import InferpoolError
from tests.lifecycle.helpers import wait_for
from tests.support import EXAMPLES, Server, free_tcp_port, identity_config, write_model


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


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
            wait_for(lambda: {r["instance"]: r for r in b.status()}["slow_0_0"]["busy"])
            with pytest.raises(InferpoolError, match="Request timeout expired"):
                b.infer("slow", {"INPUT0": np.ones(1, np.float32)}, parameters={"timeout": 1000})
            assert "error" not in a._recv(first, 10)[0]
            got = scrape(port)
            fast, slow = of("fast"), of("slow")
            assert got[("nv_inference_request_success_total", fast)] == 3
            assert got[("nv_inference_request_failure_total", fast)] == 0
            assert got[("nv_inference_count_total", fast)] == 3
            assert got[("nv_inference_exec_count_total", fast)] == 3
            assert got[("nv_inference_request_success_total", slow)] == 1
            assert got[("nv_inference_request_failure_total", slow)] == 1
            assert got[("nv_inference_compute_infer_duration_us_total", slow)] >= 300_000
            assert got[("nv_inference_queue_duration_us_total", fast)] > 0
            # identity's custom metric: 1 + 2 + 3 FP32 elements
            assert got[("input_byte_size_counter_total", fast)] == 24
            assert got[("inferpool_instance_ready", of("fast", instance="fast_0_0"))] == 1
            assert got[("inferpool_instance_restarts_total", of("slow", instance="slow_0_0"))] == 0
            assert got[("inferpool_arena_bytes", (("kind", "size"),))] == 32 << 20
            assert got[("inferpool_inflight_requests", ())] == 0

            a.infer("fast", {"INPUT0": np.ones(2, np.float32)})
            again = scrape(port)
            assert again[("nv_inference_request_success_total", fast)] == 4
            assert again[("input_byte_size_counter_total", fast)] == 32
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
