"""The broker process: its front, models and pool built once, and the one event loop.

As gunicorn's arbiter: signal handlers only record the signal and write to a wakeup fd
that the same ``zmq.Poller`` watches, so requests, worker results, child exits and
signals are all handled by one loop, one at a time.  Everything the run creates (its lock
and regions, sockets, signal handlers, workers) enters one ExitStack as it is made, so a
failed start and an orderly stop both undo exactly what exists, in reverse order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import zmq

from inferpool.broker.devshm import start_arena, warn_if_too_small
from inferpool.broker.drain import Drain, Phase
from inferpool.broker.endpoints import listen, open_run
from inferpool.broker.front.control import Control
from inferpool.broker.front.handles import Handles
from inferpool.broker.front.inference import Inference
from inferpool.broker.front.lane_grants import EXTENSIONS as LANE_EXTENSIONS
from inferpool.broker.front.lane_grants import Lanes
from inferpool.broker.front.lane_leases import LaneLeases
from inferpool.broker.front.load_metrics import Utilisation
from inferpool.broker.front.log_settings import LogSettings
from inferpool.broker.front.metrics_endpoint import BrokerCollector, MetricsEndpoint
from inferpool.broker.front.peers import KSERVE_TAG, ProcessGate
from inferpool.broker.front.readiness import Readiness
from inferpool.broker.front.registrations import Registrations
from inferpool.broker.front.responder import Responder
from inferpool.broker.front.router import Router
from inferpool.broker.front.shared_memory import EXTENSIONS, SharedMemory
from inferpool.broker.front.shares import OutputShares
from inferpool.broker.front.trace_control import TraceControl
from inferpool.broker.kserve.process import FrontendProcess
from inferpool.broker.models import repository
from inferpool.broker.models.config_support import ConfigSupport
from inferpool.broker.models.lifecycle import ModelLifecycle
from inferpool.broker.models.rate_limiter import RateLimiter
from inferpool.broker.models.registry import Instance, Registry, State
from inferpool.broker.models.reload import reload_repository
from inferpool.broker.models.request import PendingRequest
from inferpool.broker.models.response_cache import ResponseCache
from inferpool.broker.models.tracer import Tracer
from inferpool.broker.notify import Watchdog, sd_notify
from inferpool.broker.options import ServerOptions
from inferpool.broker.pool.gpu_limit import check_gpu_limits
from inferpool.broker.pool.liveness import Liveness
from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.broker.pool.placement import Planner, Topology, parse_host_policies
from inferpool.broker.pool.supervisor import Supervisor
from inferpool.broker.sched_slice import request_slice
from inferpool.shm.arena import Arena
from inferpool.shm.cancel_flags import CancelFlags
from inferpool.shm.leases import LeaseTable
from inferpool.shm.region import Region
from inferpool.shm.runs import region_name
from inferpool.wire import logs
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker.protocol import (
    Done,
    LaneClosed,
    LaneStats,
    Mapped,
    TensorRef,
    Unmapped,
)
from inferpool.wire.zmqio import NOBLOCK, recv_frames

log = logging.getLogger("inferpool.broker")
HOUSEKEEPING_S = 0.05
FRONT_BATCH = 64  # client messages handled per readiness of the socket, at most
POLLIN = int(zmq.POLLIN)
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
SERVING = Phase.SERVING


class StartInterrupted(Exception):
    """SIGTERM or SIGINT arrived while the broker was being built: nothing it made is left."""


class Broker:
    """The broker process: its parts built once, and the one event loop."""

    def __init__(
        self, options: ServerOptions, on_started: Callable[[Broker], None] | None = None
    ) -> None:
        """Start a run: its lock and regions, the clients' socket and every component.
        Models load when :meth:`run` begins; ``on_started`` hears once they all settled."""
        self.options = opts = options
        self._on_started = on_started
        self.start_error = ""  # why the start failed (--exit-on-error): run() returns 1
        self._signals: list[int] = []
        request_slice(opts.sched_slice_us)  # before any thread or child: they inherit it
        self._watchdog = Watchdog()
        self._next_poll = time.monotonic() + options.repository_poll_secs
        with contextlib.ExitStack() as stack:
            stack.callback(sd_notify, "STATUS=stopped")
            # signals first: a stop asked for while the run is built undoes what exists
            self._wake = self._catch_signals(stack)
            # the run: what loads, where it may run, its lock, regions and socket
            self._initial = _initial_models(opts)
            self._pending_start = set(self._initial)
            topology = Topology.discover()
            planner = Planner(topology, parse_host_policies(opts.host_policies, topology), opts.pin)
            check_gpu_limits(opts.model_load_gpu_limit, topology)
            curve = opts.curve_keys()  # unusable keys fail the start before anything is made
            # the endpoints before the run: a second server fails here, having touched nothing
            ctx: zmq.Context[Any] = zmq.Context()
            stack.callback(ctx.term)
            frontends = opts.frontends()  # the KServe frontends' socket: ipc, their own
            kserve_path = ""
            if frontends.enabled:
                kserve_path = os.path.join(opts.run_dir, f"kserve-{os.getpid()}.sock")
            group = opts.ipc_access == "group"
            fronts = listen(stack, ctx, opts.listen, group, curve, kserve_path)
            self.frontend, self.tagged = fronts.plain, fronts.tagged
            self.kserve_gate = ProcessGate()  # only the frontends' process speaks on theirs
            self.run_id = run_id = open_run(stack, opts.run_dir)
            arena_region = region_name(run_id, "arena")
            arena = start_arena(stack, arena_region, opts, self._interrupted)
            flags = CancelFlags.create(run_id)
            stack.callback(flags.close)
            placed = None  # the KServe frontends' process writes its inputs there
            if kserve_path:
                kserve_inputs = Region.create(
                    region_name(run_id, "kserve-in"), opts.arena_size, prefault=False
                )
                stack.callback(kserve_inputs.destroy)
                placed = (kserve_inputs.name, kserve_inputs.size)
            self.poller = zmq.Poller()
            for sock in [fronts.plain, *self.tagged.values()]:
                self.poller.register(sock, zmq.POLLIN)
            self.poller.register(self._wake, zmq.POLLIN)
            self.channels: dict[int, Instance] = {}  # worker channel fd -> its worker
            self.readers: dict[int, Callable[[], None]] = {}  # other fds (zygotes) -> reader
            # Read by the request path and the shared-memory front alike: the requests in
            # flight (by rid, in admission order) and the client regions each worker is to
            # unmap with its next message.
            inflight: dict[int, PendingRequest] = {}
            unmaps: dict[str, list[str]] = {}
            # Four parts need one built further down: those calls go through a lambda,
            # which runs once the part exists.
            models: ModelLifecycle
            shm: SharedMemory
            outputs = OutputRegions(
                run_id,
                opts.output_arena_size,
                opts.prefault,
                lent_gone=lambda region: models.requests.unmap_everywhere(region),
            )
            stack.callback(outputs.close)
            # answers (the front's): the models answer requests through them
            leases = LeaseTable(run_id)
            shares = OutputShares(opts.output_share, lambda client: shm.principal(client))
            kept = LaneLeases(leases, outputs, shares)
            handles = Handles(leases, outputs, shares, absorb=kept.absorb)
            self.responder = responder = Responder(fronts.plain, outputs, handles, self.tagged)
            # clients' regions and lanes; the models, their requests and workers
            self.registry = registry = Registry()
            self.registrations = registrations = Registrations(
                run_id,
                opts.max_client_shm,
                opts.max_shm_total,
                opts.prefault > 0,
                inflight,
                lambda: [h.identity for h in models.supervisor.alive()],
                unmaps,
            )
            self.lanes = lanes = Lanes(
                run_id,
                registry,
                registrations,
                lambda: models.supervisor.alive(),
                opts.lane_spin_us,
                kept,
                rate_limited=opts.rate_limit != "off",
            )
            tracer = Tracer(
                opts.trace,
                registry.serving,
                responder,
                lambda ref: _tensor_bytes(ref, arena, outputs),
                lambda: models.supervisor.alive(),
            )
            self.tracer = tracer
            stack.callback(lambda: tracer.flush(time.monotonic_ns(), final=True))
            limited = opts.rate_limit == "execution_count"
            cache = None
            if opts.cache_size:
                cache = ResponseCache.create(
                    run_id, opts.cache_size, opts.prefault, arena, outputs, responder
                )
            self.models = models = ModelLifecycle(
                repository=opts.model_repository,
                registry=registry,
                planner=planner,
                pool=lambda events: Supervisor(
                    opts.supervisor(), run_id, outputs, events, self._watch, self._watch_reader
                ),
                lanes=lanes,
                support=ConfigSupport(cache=opts.cache_size > 0, rate_limit=limited),
                arena=arena,
                outputs=outputs,
                responder=responder,
                flags=flags,
                limiter=RateLimiter.from_options(opts.rate_limit_resources) if limited else None,
                cache=cache,
                inflight=inflight,
                unmaps=unmaps,
                tracer=tracer,
                auto_complete=opts.auto_complete_config,
            )
            stack.callback(models.overrides.close)
            self.requests = requests = models.requests
            self.supervisor = supervisor = models.supervisor
            self.liveness = Liveness(supervisor, opts.heartbeat_ms)
            self.readiness = Readiness(registry, opts.strict_readiness)
            # the front: the shared-memory extension, drain, inference, control, the router
            cancellation = requests.cancellation
            self.shm = shm = SharedMemory(
                registrations,
                handles,
                fronts.sockets,
                opts.lease_timeout,
                responder.send,
                topology.gpus,
                cancellation.client_gone,
                lanes,
            )
            stack.callback(shm.close)  # its socket monitor must go before the context
            stack.callback(lanes.close)
            self.drain = Drain(
                self.readiness,
                requests,
                supervisor,
                opts.drain_delay,
                opts.in_flight_timeout,
                shm.peer,
                admissions_end=lanes.draining,
            )
            inference = Inference(
                self.readiness,
                registry,
                arena,
                shm,
                requests.submit,
                opts.request_limit,
                cancellation.cancel,
                tracer,
                placed,
            )
            control = Control(
                readiness=self.readiness,
                registry=registry,
                lifecycle=models,
                supervisor=supervisor,
                responder=responder,
                arena=arena,
                run_id=run_id,
                name=opts.server_id,
                extensions=(*EXTENSIONS, *LANE_EXTENSIONS, "logging", "trace"),
                explicit=opts.explicit,
                resources=lambda: {
                    "arena_slots": arena.allocator.used_blocks,
                    "output_slots_held": outputs.held(),
                    "output_regions": len(outputs),
                    "leases": len(handles.leases),
                    "registrations": len(registrations),
                    "inflight": len(inflight),
                    "lanes": len(lanes.lanes),
                },
            )
            self.router = Router(
                self.responder,
                [
                    control.handlers(),
                    inference.handlers(),
                    shm.handlers(),
                    self.drain.handlers(),
                    lanes.handlers(),
                    LogSettings(supervisor.alive, responder.send).handlers(),
                    TraceControl(tracer).handlers(),
                ],
                shm.arrived,
            )
            self.metrics: MetricsEndpoint | None = None
            self.utilisation: Utilisation | None = None
            if opts.metrics_port:
                self.utilisation = Utilisation(supervisor)
                collector = BrokerCollector(
                    registry, requests, supervisor, arena, self.utilisation, lanes
                )
                self.metrics = MetricsEndpoint(
                    collector, ctx, opts.metrics_address, opts.metrics_port
                )
                stack.callback(self.metrics.close)
                self.poller.register(self.metrics.socket, zmq.POLLIN)
            # the KServe frontends: their own process, a zmq client of their ROUTER over ipc
            self.kserve: FrontendProcess | None = None
            if kserve_path:
                assert placed is not None
                self.kserve = FrontendProcess(
                    frontends,
                    f"ipc://{kserve_path}",
                    placed[0],
                    on_start=self.kserve_gate.allow,
                    on_exit=self._kserve_gone,
                )
                stack.callback(self.kserve.close)
            stack.callback(supervisor.kill_all)
            self._interrupted()
            self._stack = stack.pop_all()

    def _catch_signals(self, stack: contextlib.ExitStack) -> socket.socket:
        """Signals are recorded and wake the loop through a socketpair; restored at close."""
        wake_r, wake_w = socket.socketpair()
        stack.callback(wake_r.close)
        stack.callback(wake_w.close)
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        stack.callback(signal.set_wakeup_fd, -1)
        for sig in SIGNALS:
            stack.callback(signal.signal, sig, signal.signal(sig, self._on_signal))
        return wake_r

    def _interrupted(self) -> None:
        """While the run is built: raise StartInterrupted if a stop signal has come."""
        for signum in self._signals:
            if signum in STOP_SIGNALS:
                name = signal.Signals(signum).name
                log.info("the start was interrupted by %s: undoing what was made", name)
                raise StartInterrupted(f"the start was interrupted by {name}")

    def close(self) -> None:
        """Release everything this run created; safe to call more than once."""
        self._stack.close()

    # ================================================================== start-up
    def _start_waiter(self, name: str) -> Callable[[InferpoolError | None], None]:
        def done(err: InferpoolError | None) -> None:
            self._pending_start.discard(name)
            self._maybe_started()

        return done

    def _maybe_started(self) -> None:
        if self.readiness.started or self._pending_start:
            return
        self.readiness.started = True
        logs.serving()  # (the start's INFO lines were verbose ones: wire.logs)
        rows = self.registry.index()
        ready = sum(1 for r in rows if r["state"] == State.READY.value)
        log.debug("started: %d of %d model version(s) READY", ready, len(rows))
        warn_if_too_small(self.options, len(self.supervisor.handles))
        failed = [r for r in rows if r["state"] != State.READY.value]
        for r in failed:
            log.error(
                "model '%s' version %s is %s: %s",
                r["name"],
                r["version"],
                r["state"],
                r["reason"],
            )
        if failed and self.options.exit_on_error:
            # Triton's --exit-on-error (its default): the start fails, the loaded stop too
            self.start_error = "failed to load all models"
            self.drain.begin(self.start_error, time.monotonic())
        else:
            sd_notify("READY=1\nSTATUS=serving")
        if self._on_started is not None:
            self._on_started(self)

    def ready(self) -> bool:
        return self.readiness.ready()

    # ================================================================== the loop
    def _watch(self, fd: int, handle: Instance | None) -> None:
        """Poll a worker's channel (None: stop)."""
        self._poll(self.channels, fd, handle)

    def _watch_reader(self, fd: int, reader: Callable[[], None] | None) -> None:
        """Poll another fd (a zygote's socket) and call ``reader`` when it is readable."""
        self._poll(self.readers, fd, reader)

    def _poll(self, table: dict[int, Any], fd: int, target: Any) -> None:
        if target is None:
            if table.pop(fd, None) is not None:
                self.poller.unregister(fd)
        else:
            table[fd] = target
            self.poller.register(fd, zmq.POLLIN)

    def run(self) -> int:
        """Load the initial models and serve until a signal stops the broker (0), then close.

        One iteration per readiness, and it is on every request's path: it reads what it
        needs into locals once, asks the clock once, and reaches for the timers (batching
        decisions, zero-copy sends, housekeeping) only when one is pending."""
        poll, items = zmq.zmq_poll, self.poller.sockets  # (the Poller's list, kept in place)
        models, requests, responder = self.models, self.requests, self.responder
        drain = self.drain
        frontend, tagged, metrics = self.frontend, self.tagged, self.metrics
        channels, readers, wake_fd = self.channels, self.readers, self._wake.fileno()
        next_housekeeping = 0.0
        try:
            for name in self._initial:
                models.load(name, self._start_waiter(name))
            self._maybe_started()
            now = time.monotonic()
            while True:
                timeout = next_housekeeping - now
                if requests.wakes:
                    wake_ns = requests.tick(time.monotonic_ns())
                    if wake_ns is not None:
                        timeout = min(timeout, (wake_ns - time.monotonic_ns()) / 1e9)
                if responder.sending and responder.poll():
                    timeout = min(timeout, 0.001)
                ms = int(timeout * 1000) + 1 if timeout > 0 else 0
                events = dict(poll(items, ms))
                for fd in events:
                    handle = channels.get(fd)
                    if handle is not None:
                        self._from_worker(handle)
                    elif fd in readers:  # a zygote: it may report a worker's exit
                        readers[fd]()
                        self.supervisor.reap()
                if frontend in events:
                    self._drain_frontend()
                if tagged:
                    for tag, sock in tagged.items():
                        if sock in events:
                            self._drain_tagged(tag, sock)
                if metrics is not None and metrics.socket in events:
                    metrics.answer()
                if wake_fd in events or self._signals:
                    self._handle_signals()
                if requests.dispatched:
                    self._read_dispatched()
                now = time.monotonic()
                if now >= next_housekeeping:
                    self._housekeeping(now)
                    next_housekeeping = now + HOUSEKEEPING_S
                if drain.phase is not SERVING and drain.step(now):
                    return 1 if self.start_error else 0
        finally:
            self.close()

    def _drain_frontend(self) -> None:
        """The messages waiting (up to FRONT_BATCH), then their dispatch: requests that
        arrived together can run as one batch, and they cost one poll."""
        frontend, requests, handle = self.frontend, self.requests, self.router.handle
        waiting = [(frontend, POLLIN)]  # (a poll without a timeout: cheaper than EVENTS)
        requests.gather()
        try:
            for _ in range(FRONT_BATCH):
                handle(recv_frames(frontend, NOBLOCK))
                if not zmq.zmq_poll(waiting, 0):
                    break
        finally:
            requests.dispatch_gathered()

    def _drain_tagged(self, tag: bytes, sock: zmq.Socket[Any]) -> None:
        """A message of a tagged socket; on the KServe frontends' socket, only those of the
        frontends' process are handled."""
        frames = recv_frames(sock, NOBLOCK)
        if tag == KSERVE_TAG and not self.kserve_gate.admits(frames[0]):
            log.warning("dropped a message on the KServe frontends' socket from another process")
            return
        self.router.handle(frames, tag)

    def _kserve_gone(self) -> None:
        """The frontends' process ended: what it had in flight for its callers is cancelled,
        the handles it held are reclaimed."""
        self.requests.cancellation.clients_gone(KSERVE_TAG)
        self.shm.reclaim_tagged(KSERVE_TAG)

    def _read_dispatched(self) -> None:
        """Read the channels of the workers just sent a batch, without a poll: a worker on
        this core ran as the send woke it and has usually answered already (one elsewhere
        has not: one empty read).  A batch that answer starts is looked at the same way."""
        dispatched = self.requests.dispatched
        while dispatched:
            handle = dispatched.pop()
            if handle.channel is not None:
                self._from_worker(handle)

    def _from_worker(self, handle: Instance) -> None:
        assert handle.channel is not None
        msg = handle.channel.recv()
        if type(msg) is Done:  # a batch's results: the common case
            self.requests.done(handle, msg)
        elif msg is None:  # its end closed: the process is exiting; reap() will say how
            self.supervisor.close_channel(handle)
        elif isinstance(msg, Mapped):  # CUDA regions a CUDA unregister will wait on
            self.registrations.mapped(handle.identity, msg.refs)
        elif isinstance(msg, Unmapped):  # a CUDA unregister may be waiting for it
            self.registrations.unmapped(handle.identity, msg.refs)
        elif isinstance(msg, LaneStats):
            self.lanes.worker_stats(handle, msg)
            if msg.traces:
                self.tracer.lane(handle, msg.traces)
            if msg.metrics is not None:
                self.requests.metrics.apply(msg.metrics)
        elif isinstance(msg, LaneClosed):
            self.lanes.worker_closed(handle, msg)
        elif msg:
            self.requests.worker_message(handle, msg)

    def _housekeeping(self, now: float) -> None:
        self._watchdog.tick(now)
        self.supervisor.reap()
        self.supervisor.tick(now)
        self.liveness.check(now)
        self.requests.tick(time.monotonic_ns())
        self.models.ensembles.refresh()
        self.shm.tick(now)
        if self.kserve is not None:
            self.kserve.tick(now)
        self.requests.flush_frees()
        if self.tracer.ended or self.tracer.unwritten:
            self.tracer.flush(time.monotonic_ns())
        if self.utilisation is not None:
            self.utilisation.sample(now)
        if self.options.polling and now >= self._next_poll and not self.drain.active:
            self._next_poll = now + self.options.repository_poll_secs
            reload_repository(self.models)  # poll mode: what changed on disk is applied

    # ================================================================== signals
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)

    def _handle_signals(self) -> None:
        try:
            while self._wake.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        signals, self._signals = self._signals, []
        for signum in signals:
            if signum == signal.SIGCHLD:
                self.supervisor.reap()
            elif signum in STOP_SIGNALS:
                self.drain.begin(f"received {signal.Signals(signum).name}", time.monotonic())
            elif signum == signal.SIGHUP:
                self.reload()

    def reload(self) -> None:
        """SIGHUP: changed models are replaced without failing requests (models/reload.py)."""
        if self.options.explicit:
            log.info("SIGHUP ignored: models are controlled explicitly")
            return
        log.info("SIGHUP: reloading the model repository")
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        sd_notify(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading the model repository")
        reload_repository(self.models, _notify_reloaded)


def _initial_models(opts: ServerOptions) -> list[str]:
    """What loads at start: every model, or those named with ``--load-model`` when explicit."""
    available = repository.list_models(opts.model_repository)
    if not opts.explicit or "*" in opts.load_models:
        return available
    return list(opts.load_models)


def _notify_reloaded(_err: InferpoolError | None) -> None:
    sd_notify("READY=1\nSTATUS=serving")


def _tensor_bytes(ref: TensorRef, arena: Arena, outputs: OutputRegions) -> memoryview | None:
    """A tensor's bytes where the broker maps them (the arena, output regions) for a trace's
    TENSORS records; None in a client's region."""
    if ref.region == arena.name:
        return arena.region.view(ref.offset, ref.byte_size)
    try:
        return outputs.view(ref.region, ref.offset, ref.byte_size)
    except KeyError:
        return None
