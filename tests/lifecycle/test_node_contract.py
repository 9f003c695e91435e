"""The per-node contract an orchestrator relies on, against a real broker and its workers:
``/livez`` and ``/readyz`` (and Triton's ``/v2/health/*``) through loading, a lost instance
and a drain; ``POST /drain`` finishing what it admitted and exiting 0; the load metrics."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inferpool.client import InferpoolError
from tests.lifecycle.helpers import instance
from tests.node_support import drain_over_http, gated_repo, http, not_yet_started, send_held
from tests.support import Server, free_tcp_port, wait_until

OK = (200, "ok\n")


def load_samples(port: int) -> dict[tuple[str, str], float]:
    """{(metric, instance or model): value} of the load metrics on the metrics port."""
    status, text = http(port, "/metrics")
    assert status == 200, text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") == "gated":
                out[(s.name, s.labels.get("instance", s.labels["model"]))] = s.value
    return out


def test_readiness_through_loading_a_lost_instance_and_a_drain(short_tmp) -> None:
    repo, gate = gated_repo(short_tmp)
    port, metrics = free_tcp_port(), free_tcp_port()
    args = ("--health-port", str(port), "--metrics-port", str(metrics), "--drain-timeout", "30")
    with not_yet_started(Server(short_tmp, repo, *args)) as server:
        # loading: alive, not ready, and saying why
        wait_until(lambda: http(port, "/livez") == OK, what="/livez while loading")
        assert http(port, "/readyz") == (503, "not ready: loading 'gated'\n")
        assert http(port, "/v2/health/live") == (200, "")
        assert http(port, "/v2/health/ready") == (400, "")
        (gate / "load").touch()
        wait_until(lambda: http(port, "/readyz") == OK, what="ready once loaded")
        assert http(port, "/v2/health/ready") == (200, "")
        server.wait_started()

        with server.client() as c:
            # the only instance is lost, and its successor is held loading: not ready
            (gate / "load").unlink()
            os.kill(instance(c, "gated_0")["pid"], signal.SIGKILL)
            body = wait_until(lambda: (r := http(port, "/readyz"))[0] == 503 and r[1])
            assert body and body.startswith(
                "not ready: model 'gated' version 1 has no live instance"
            )
            assert http(port, "/livez") == OK
            (gate / "load").touch()
            wait_until(lambda: http(port, "/readyz") == OK, what="ready once respawned")

            # one request executes (held), one waits for the instance: the load metrics
            held, queued = send_held(c), send_held(c, 2.0)
            wait_until(lambda: instance(c, "gated_0")["busy"])
            wait_until(lambda: c.statistics()["inflight"] == 2)
            load = load_samples(metrics)
            assert load[("nv_inference_pending_request_count", "gated")] == 1
            assert load[("inferpool_model_inflight_requests", "gated")] == 2
            assert (
                load[("inferpool_instance_busy_seconds_total", "gated_0")] > 0
            )  # as the parser names it
            assert 0 < load[("inferpool_instance_utilization", "gated_0")] <= 1

            # the drain: not ready at once, new requests refused, admitted ones finish
            reply = drain_over_http(port)
            assert reply == {"draining": True, "reason": "asked to drain", "inflight": 2}
            assert http(port, "/readyz") == (503, "not ready: draining (asked to drain)\n")
            assert http(port, "/v2/health/ready") == (400, "")
            assert http(port, "/livez") == OK
            with pytest.raises(InferpoolError, match=r"draining \(asked to drain\)") as err:
                c.infer("gated", {"INPUT0": np.ones(1, np.float32)})
            assert err.value.code.value == "UNAVAILABLE"
            assert c.drain()["inflight"] == 2  # a second drain changes nothing
            (gate / "finish").touch()
            for rid, value in ((held, -1.0), (queued, 2.0)):
                header, frames = c._recv(rid, 30)
                assert "error" not in header, header
                assert np.frombuffer(frames[0], np.float32).tolist() == [value]
        assert server.proc.wait(30) == 0, server.log()
    assert "draining (asked to drain)" in server.log()
