"""The broker process: sockets, the one event loop, start-up and orderly shutdown.

As gunicorn's arbiter: signal handlers only record the signal and write to a wakeup fd
that the same ``zmq.Poller`` watches, so requests, worker results, child exits and
signals are all handled by one loop, one at a time.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import time
from typing import Any

import posix_ipc
import zmq

from inferpool.broker.front.admission import SharedMemoryInputs
from inferpool.broker.front.metrics import MetricsEndpoint
from inferpool.broker.front.responder import Responder
from inferpool.broker.front.router import Frontend
from inferpool.broker.front.shared_memory import SharedMemory
from inferpool.broker.models import repository
from inferpool.broker.models.manager import Manager
from inferpool.broker.models.registry import Registry, State
from inferpool.broker.models.reload import reload_repository
from inferpool.broker.notify import sd_notify
from inferpool.broker.options import ServerOptions
from inferpool.broker.pool.gpu_limit import check_gpu_limits
from inferpool.broker.pool.liveness import Liveness
from inferpool.broker.pool.outputs import OutputRegions
from inferpool.broker.pool.placement import parse_host_policies
from inferpool.broker.pool.supervisor import Supervisor, WorkerHandle
from inferpool.shm.arena import Arena
from inferpool.shm.region import Region
from inferpool.shm.runs import RunLock, region_name, regions_of_run, sweep_dead_runs
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.zmqio import NOBLOCK, recv_frames

log = logging.getLogger("inferpool.broker")
HOUSEKEEPING_S = 0.05


class Broker:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.stopping = False
        self.started = False
        self.shm_inputs: SharedMemoryInputs | None = None
        self.shm: SharedMemory | None = None
        self.extra_extensions: list[str] = []
        self._signals: list[int] = []
        self._stop_deadline = 0.0
        self._workers_stopping = False
        self._closed = False
        self._bound_ipc: list[str] = []
        self.on_started: Any = None  # called once every initial model has settled
        self.metrics: MetricsEndpoint | None = None

    # ================================================================== start-up
    def start(self) -> None:
        """Sweep dead runs, create this run's regions and sockets, start loading models."""
        opts = self.options
        swept = sweep_dead_runs()
        if swept:
            log.warning("removed %d shared-memory region(s) left by dead runs", len(swept))
        os.makedirs(opts.run_dir, mode=0o700, exist_ok=True)
        self.run_lock = RunLock()
        self.run_id = self.run_lock.run_id
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        opts = self.options
        self.arena = Arena(
            Region.create(
                region_name(self.run_id, "arena"), opts.arena_size, prefault=opts.prefault
            )
        )
        self.outputs = OutputRegions(self.run_id, opts.output_arena_size, opts.prefault)
        self.ctx = zmq.Context()
        self.frontend = self.ctx.socket(zmq.ROUTER)
        self.frontend.setsockopt(zmq.LINGER, 0)
        for endpoint in opts.listen:
            self._bind(endpoint)
        self.responder = Responder(self.frontend, self.outputs)
        self.registry = Registry()
        self.manager = Manager(opts, self.registry, self.arena, self.outputs, self.responder)
        self.manager.policies = parse_host_policies(opts.host_policies, self.manager.topology)
        check_gpu_limits(opts.model_load_gpu_limit, self.manager.topology)
        self.poller = zmq.Poller()
        self.poller.register(self.frontend, zmq.POLLIN)
        self.channels: dict[int, WorkerHandle] = {}  # worker channel fd -> its worker
        self.supervisor = Supervisor(opts, self.run_id, self.outputs, self.manager, self._watch)
        self.manager.supervisor = self.supervisor
        self.liveness = Liveness(self.supervisor, opts.heartbeat_ms)
        self.frontend_handler = Frontend(self)
        if opts.metrics_port:
            self.metrics = MetricsEndpoint(self, self.ctx, opts.metrics_address, opts.metrics_port)
        self.shm = SharedMemory(self)
        self.shm_inputs = self.shm
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._on_signal)
        names = self._initial_models()
        self._pending_start = set(names)
        for name in names:
            self.manager.load(name, self._start_waiter(name))
        self._maybe_started()

    def _bind(self, endpoint: str) -> None:
        if endpoint.startswith("ipc://"):
            path = endpoint[len("ipc://") :]
            os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
            if _unix_socket_in_use(path):
                raise InferpoolError(
                    Code.UNAVAILABLE, f"cannot listen on {endpoint}: another server is using it"
                )
        try:
            self.frontend.bind(endpoint)
        except zmq.ZMQError as exc:
            raise InferpoolError(Code.UNAVAILABLE, f"cannot listen on {endpoint}: {exc}") from None
        if endpoint.startswith("ipc://"):
            self._bound_ipc.append(endpoint[len("ipc://") :])
        log.info("listening on %s", endpoint)

    def _initial_models(self) -> list[str]:
        opts = self.options
        available = repository.list_models(opts.model_repository)
        if opts.model_control_mode != "explicit":
            return available
        if "*" in opts.load_models:
            return available
        return list(opts.load_models)

    def _start_waiter(self, name: str) -> Any:
        def done(err: InferpoolError | None) -> None:
            self._pending_start.discard(name)
            self._maybe_started()

        return done

    def _maybe_started(self) -> None:
        if self.started or self._pending_start:
            return
        self.started = True
        rows = self.registry.index()
        ready = sum(1 for r in rows if r["state"] == State.READY.value)
        log.info("started: %d of %d model version(s) READY", ready, len(rows))
        for r in rows:
            if r["state"] != State.READY.value:
                log.error(
                    "model '%s' version %s is %s: %s",
                    r["name"],
                    r["version"],
                    r["state"],
                    r["reason"],
                )
        sd_notify("READY=1\nSTATUS=serving")
        if self.on_started is not None:
            self.on_started(self)

    def ready(self) -> bool:
        if not self.started or self.stopping:
            return False
        if not self.options.strict_readiness:
            return True
        return all(r["state"] == State.READY.value for r in self.registry.index())

    # ================================================================== the loop
    def _watch(self, fd: int, handle: WorkerHandle | None) -> None:
        if handle is None:
            if self.channels.pop(fd, None) is not None:
                self.poller.unregister(fd)
        else:
            self.channels[fd] = handle
            self.poller.register(fd, zmq.POLLIN)

    def run(self) -> int:
        poller = self.poller
        poller.register(self._wake_r, zmq.POLLIN)
        metrics = self.metrics
        if metrics is not None:
            poller.register(metrics.socket, zmq.POLLIN)
        next_housekeeping = 0.0
        try:
            while True:
                now = time.monotonic()
                timeout = max(0.0, next_housekeeping - now)
                wake_ns = self.manager.tick(time.monotonic_ns()) if self.manager.wakes else None
                if wake_ns is not None:
                    timeout = min(timeout, max(0.0, (wake_ns - time.monotonic_ns()) / 1e9))
                if self.responder.poll():
                    timeout = min(timeout, 0.001)
                events = dict(poller.poll(int(timeout * 1000) + (1 if timeout > 0 else 0)))
                for fd in events:
                    handle = self.channels.get(fd)
                    if handle is not None:
                        self._from_worker(handle)
                if self.frontend in events:
                    self._drain_frontend()
                if metrics is not None and metrics.socket in events:
                    metrics.answer()
                if self._wake_r.fileno() in events or self._signals:
                    self._handle_signals()
                now = time.monotonic()
                if now >= next_housekeeping:
                    self._housekeeping(now)
                    next_housekeeping = now + HOUSEKEEPING_S
                if self.stopping and self._shutdown_step(now):
                    return 0
        finally:
            self.close()

    def _drain_frontend(self) -> None:
        """One message per readiness: the next poll returns at once if more are waiting."""
        self.frontend_handler.handle(recv_frames(self.frontend, NOBLOCK))

    def _from_worker(self, handle: WorkerHandle) -> None:
        assert handle.channel is not None
        msg = handle.channel.recv()
        if msg is None:  # its end closed: the process is exiting; reap() will say how
            self.supervisor.close_channel(handle)
        elif msg:
            self.manager.worker_message(handle, msg)

    def _housekeeping(self, now: float) -> None:
        self.supervisor.reap()
        self.supervisor.tick(now)
        self.liveness.check(now)
        self.manager.tick(time.monotonic_ns())
        if self.shm is not None:
            self.shm.tick(now)
        self.manager.flush_frees()

    # ================================================================== signals
    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signals.append(signum)

    def _handle_signals(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        signals, self._signals = self._signals, []
        for signum in signals:
            if signum == signal.SIGCHLD:
                self.supervisor.reap()
            elif signum in (signal.SIGTERM, signal.SIGINT):
                self.begin_shutdown(f"received {signal.Signals(signum).name}")
            elif signum == signal.SIGHUP:
                self.reload()

    def reload(self) -> None:
        """SIGHUP: changed models are replaced without failing requests (models/reload.py)."""
        if self.options.model_control_mode == "explicit":
            log.info("SIGHUP ignored: models are controlled explicitly")
            return
        log.info("SIGHUP: reloading the model repository")
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        sd_notify(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading the model repository")
        reload_repository(self.manager, _notify_reloaded)

    # ================================================================== shutdown
    def begin_shutdown(self, why: str) -> None:
        if self.stopping:
            return
        log.info("shutting down (%s): finishing in-flight requests", why)
        sd_notify("STOPPING=1")
        self.stopping = True
        self._stop_deadline = time.monotonic() + self.options.graceful_timeout

    def _shutdown_step(self, now: float) -> bool:
        """Advance the shutdown; True once every worker has stopped."""
        manager = self.manager
        if not self._workers_stopping:
            if manager.inflight and now < self._stop_deadline:
                return False
            err = InferpoolError(
                Code.UNAVAILABLE, "the server shut down before the request finished"
            )
            for req in list(manager.inflight.values()):
                manager.reject(req, err)
            for handle in list(self.supervisor.handles.values()):
                self.supervisor.stop(handle)
            self._workers_stopping = True
        self.supervisor.reap()
        return not self.supervisor.alive()

    def close(self) -> None:
        """Release everything this run created; safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        supervisor = getattr(self, "supervisor", None)
        if supervisor is not None:
            supervisor.kill_all()
        if self.metrics is not None:
            self.metrics.close()
        shm = getattr(self, "shm", None)
        if shm is not None:
            shm.close()  # its socket monitor must go before the context
        frontend = getattr(self, "frontend", None)
        if frontend is not None:
            frontend.close(0)
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            ctx.term()
        if hasattr(self, "_wake_r"):
            signal.set_wakeup_fd(-1)
            self._wake_r.close()
            self._wake_w.close()
        outputs = getattr(self, "outputs", None)
        if outputs is not None:
            outputs.close()
        arena = getattr(self, "arena", None)
        if arena is not None:
            arena.destroy()
        for name in regions_of_run(self.run_id) if hasattr(self, "run_id") else []:
            if not name.endswith("-lock"):
                _unlink(name)  # anything a worker created under this run (e.g. shared weights)
        if hasattr(self, "run_lock"):
            self.run_lock.release()
        for path in self._bound_ipc:
            _remove(path)
        sd_notify("STATUS=stopped")


def _notify_reloaded(_err: InferpoolError | None) -> None:
    sd_notify("READY=1\nSTATUS=serving")


def _unlink(name: str) -> None:
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory("/" + name)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _unix_socket_in_use(path: str) -> bool:
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError as exc:
        return exc.errno not in (errno.ECONNREFUSED, errno.ENOENT)
    finally:
        probe.close()
    return True
