"""The Prometheus endpoint (``--metrics-port``): Triton's metric names, from the broker's numbers.

The numbers live in the broker's single-threaded loop, so the HTTP server's thread never
reads them: a scrape sends a sequence number over an inproc zmq PAIR, the loop (which polls
the other end beside its sockets) renders the text (front.exposition) and sends it back.
A loop that does not answer within ``SCRAPE_TIMEOUT_S`` gets the scrape a 503.

Metric names and types are exactly Triton's (``nv_inference_request_success``, a counter with
no ``_total`` suffix; ``nv_inference_request_failure`` with a ``reason`` label: REJECTED,
CANCELED, BACKEND, OTHER), labelled ``model`` and ``version``; backends' custom metrics
(identity's ``input_byte_size_counter``) keep the names and labels they declared.
``inferpool_*`` metrics add the instances and the arena, and ``front.load_metrics`` the
node's load for autoscalers (queue depth, in flight, utilisation).
"""

from __future__ import annotations

import http.server
import itertools
import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import zmq

from inferpool.broker.front.cache_metrics import MetricRows, cache_metrics
from inferpool.broker.front.exposition import CONTENT_TYPE, Family, render
from inferpool.broker.front.lane_grants import Lanes
from inferpool.broker.front.load_metrics import Utilisation, load_metrics
from inferpool.broker.models.registry import Registry
from inferpool.broker.models.request_path import RequestPath
from inferpool.broker.pool.handle import WorkerState
from inferpool.broker.pool.supervisor import Supervisor
from inferpool.shm.arena import Arena
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.metrics")
SCRAPE_TIMEOUT_S = 5.0
_VERSION_LABELS = ["model", "version"]
# (Triton name, help, ModelStats attribute) for cumulative durations in microseconds
_DURATIONS = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        "success",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        "queue",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached "
        "requests)",
        "compute_output",
    ),
)


class BrokerCollector:
    """Reads the broker's statistics at scrape time (in the broker's loop)."""

    def __init__(
        self,
        registry: Registry,
        requests: RequestPath,
        supervisor: Supervisor[Any],
        arena: Arena,
        utilisation: Utilisation,
        lanes: Lanes | None = None,
    ) -> None:
        self.registry = registry
        self.requests = requests
        self.supervisor = supervisor
        self.arena = arena
        self.utilisation = utilisation
        self.lanes = lanes

    def collect(self) -> Iterator[Family]:
        success = Family(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            labels=_VERSION_LABELS,
        )
        failure = Family(
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
            labels=[*_VERSION_LABELS, "reason"],
        )
        count = Family(
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            labels=_VERSION_LABELS,
        )
        executions = Family(
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            labels=_VERSION_LABELS,
        )
        durations = [(Family(n, h, labels=_VERSION_LABELS), attr) for n, h, attr in _DURATIONS]
        for mv in self.registry.all_versions():
            labels = [mv.name, mv.version_str]
            stats = mv.stats
            success.add(labels, stats.success.count)
            for reason, failed in stats.failures.items():
                failure.add([*labels, reason], failed)
            count.add(labels, stats.inference_count)
            executions.add(labels, stats.execution_count)
            for family, attr in durations:
                family.add(labels, getattr(stats, attr).ns / 1000.0)
        yield from (success, failure, count, executions)
        yield from (family for family, _ in durations)
        yield from self._instances()
        yield from self._lanes()
        yield from self._custom()
        yield from _families(cache_metrics(self.registry, self.requests.cache))
        yield from _families(
            load_metrics(self.requests.inflight, self.registry, self.supervisor, self.utilisation)
        )
        arena = Family(
            "inferpool_arena_bytes", "Request input arena, by size and free", "gauge", ["kind"]
        )
        arena.add(["size"], self.arena.size)
        arena.add(["free"], self.arena.free_bytes)
        yield arena
        inflight = Family(
            "inferpool_inflight_requests", "Requests admitted and not yet answered", "gauge"
        )
        inflight.add([], len(self.requests.inflight))
        yield inflight

    def _instances(self) -> Iterator[Family]:
        labels = ["model", "version", "instance"]
        ready = Family(
            "inferpool_instance_ready", "1 if the instance's worker is READY", "gauge", labels
        )
        restarts = Family(
            "inferpool_instance_restarts", "Respawns of the instance's worker", "counter", labels
        )
        for h in self.supervisor.handles.values():
            key = [h.model.name, h.model.version_str, h.name]
            ready.add(key, 1.0 if h.state is WorkerState.READY else 0.0)
            restarts.add(key, h.restarts)
        yield ready
        yield restarts

    def _lanes(self) -> Iterator[Family]:
        requests = Family(
            "inferpool_lane_requests",
            "Inference requests served over lanes (they are also counted in nv_inference_*)",
            "counter",
            [*_VERSION_LABELS, "outcome"],
        )
        lanes = Family("inferpool_lanes_open", "Open lanes", "gauge", _VERSION_LABELS)
        for mv in self.registry.all_versions():
            labels = [mv.name, mv.version_str]
            requests.add([*labels, "success"], mv.stats.lane_success)
            requests.add([*labels, "fail"], mv.stats.lane_fail)
            lanes.add(labels, self.lanes.open_count(mv) if self.lanes else 0)
        yield requests
        yield lanes

    def _custom(self) -> Iterator[Family]:
        """Backend metrics: one family per declared name, labels as the backend gave them."""
        custom = self.requests.metrics
        rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in custom.to_list():
            rows[row["family"]].append(row)
        for name, family_rows in sorted(rows.items()):
            info = custom.families.get(name, {})
            keys = sorted({k for row in family_rows for k in row["labels"]})
            kind = "gauge" if info.get("kind") == "gauge" else "counter"
            family = Family(name, info.get("description", "") or name, kind, keys)
            for row in family_rows:
                family.add([str(row["labels"].get(k, "")) for k in keys], row["value"])
            yield family


def _families(rows: list[MetricRows]) -> Iterator[Family]:
    for name, doc, kind, labels, samples in rows:
        yield Family(name, doc, kind, labels, samples)


class MetricsEndpoint:
    """The HTTP server thread and the broker-side end of its inproc bridge."""

    def __init__(
        self, collector: BrokerCollector, ctx: zmq.Context[Any], address: str, port: int
    ) -> None:
        self.collector = collector
        endpoint = f"inproc://inferpool-metrics-{id(self)}"
        self.socket = ctx.socket(zmq.PAIR)  # polled by the broker's loop
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        bridge = ctx.socket(zmq.PAIR)  # used by the HTTP thread only
        bridge.setsockopt(zmq.LINGER, 0)
        bridge.connect(endpoint)
        try:
            self.http = _HTTPServer((address, port), _Handler)
        except OSError as exc:
            bridge.close(0)
            self.socket.close(0)
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"cannot serve metrics on {address}:{port}: {exc.strerror}; choose another "
                "--metrics-port, or serve none with --allow-metrics false",
            ) from None
        self.http.bridge = bridge
        self.port = int(self.http.server_address[1])
        self._thread = threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", address, self.port)

    def answer(self) -> None:
        """In the broker's loop: render the metrics for the scrape that is waiting."""
        seq = self.socket.recv()
        self.socket.send(seq, zmq.SNDMORE)
        self.socket.send(render(self.collector.collect()))

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self._thread.join(5)
        self.http.bridge.close(0)
        self.socket.close(0)


class _HTTPServer(http.server.HTTPServer):
    bridge: zmq.Socket[Any]
    sequence = itertools.count()


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    timeout = SCRAPE_TIMEOUT_S  # a client that sends nothing does not hold the thread

    def do_GET(self) -> None:
        if self.path.split("?")[0] != "/metrics":
            self._reply(404, b"not found: metrics are at /metrics\n", "text/plain")
            return
        body = self._scrape()
        if body is None:
            self._reply(503, b"the broker did not answer in time\n", "text/plain")
        else:
            self._reply(200, body, CONTENT_TYPE)

    def _scrape(self) -> bytes | None:
        bridge = self.server.bridge
        seq = str(next(self.server.sequence)).encode()
        bridge.send(seq)
        while bridge.poll(int(SCRAPE_TIMEOUT_S * 1000)):
            got, body = bridge.recv(), bridge.recv()
            if got == seq:  # an answer to an earlier, timed-out scrape is skipped
                return body
        return None

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)
