"""The broker's side of the KServe frontends' process: start it, watch it, restart it, stop it.

The frontends run in a process of their own (``kserve.frontends``), so parsing HTTP and gRPC,
decoding tensors and writing answers never takes the broker's interpreter lock: the broker's
loop, which every client's request goes through, stays free.  The process talks to the broker
over the ipc socket ``endpoint`` (the broker lets through only this process's connections:
``front.peers.ProcessGate``) and is tied to the broker's life by its standard input, a pipe
whose write end only the broker holds.

Start: the broker waits until the process says it serves (its listeners are bound), or fails
with the process's own line (a port in use).  A process that dies later is reported by
:meth:`FrontendProcess.tick`, which calls ``on_exit`` (the broker ends what the process had
in flight) and starts a new one after a back-off that doubles from ``RESTART_S`` with each
end that follows a start by less than ``STEADY_S`` (a failed start, a crash loop), up to
``RESTART_MAX_S``; each failure is logged with its reason and the delay.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from inferpool.broker.kserve.frontend_options import FrontendOptions, ProcessConfig
from inferpool.wire import logs
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.logs import settings_dict

log = logging.getLogger("inferpool.kserve")
START_TIMEOUT_S = 60.0  # importing aiohttp and grpc on a loaded machine
STOP_TIMEOUT_S = 5.0  # its listeners get two seconds to finish the calls in progress
RESTART_S = 0.5
RESTART_MAX_S = 30.0
STEADY_S = 10.0  # a process that served this long before it ended restarts after RESTART_S
# glibc's allocator in the process: every block from its heap, and up to KEEP_FREED of freed
# heap kept mapped.  A message's buffers (tens of MiB) then reuse pages already mapped: a
# fresh mapping for each costs a page fault per 4 KiB, more than copying the message.
KEEP_FREED = 512 << 20
MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(KEEP_FREED)}


class FrontendProcess:
    """One frontends' process at a time, started at once (InferpoolError if it cannot serve)."""

    def __init__(
        self,
        options: FrontendOptions,
        endpoint: str,
        input_region: str,
        on_start: Callable[[int], None],
        on_exit: Callable[[], None],
    ) -> None:
        """``input_region``: the region the broker made for the process's inputs;
        ``on_start(pid)`` hears each new process before it connects; ``on_exit`` each end the
        broker did not ask for."""
        self._options = options
        self._endpoint = endpoint
        self._input_region = input_region
        self._on_start = on_start
        self._on_exit = on_exit
        self._proc: subprocess.Popen[bytes] | None = None
        self._lifeline = -1  # the write end of the process's standard input
        self._report = -1  # the read end of its report pipe, until it has reported
        self._backoff = RESTART_S
        self._restart_at: float | None = None
        self._serving = False  # the current process said it is ready
        self._ready_at = 0.0
        self._spawn()
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._report >= 0:
            wait = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._report], [], [], wait)
            if not ready:
                self.close()
                raise InferpoolError(Code.UNAVAILABLE, "the KServe frontends did not start in time")
            why = self._read_report()
            if why is not None:
                self.close()
                raise InferpoolError(Code.UNAVAILABLE, why)

    @property
    def pid(self) -> int:
        return self._proc.pid if self._proc is not None else 0

    def _spawn(self) -> None:
        report_r, report_w = os.pipe()
        life_r, life_w = os.pipe()
        log = settings_dict(logs.current())  # as the broker logs now
        config = ProcessConfig(self._options, self._endpoint, self._input_region, report_w, log)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "inferpool.broker.kserve.frontends", config.to_json()],
                stdin=life_r,
                pass_fds=(report_w,),
                env={**MALLOC_ENV, **os.environ},  # the user's own settings win
            )
        finally:
            os.close(report_w)
            os.close(life_r)
        self._lifeline, self._report = life_w, report_r
        self._on_start(self._proc.pid)

    def _read_report(self) -> str | None:
        """Read the process's report: None once it said ``ready`` (or has not yet said
        anything), else why it cannot serve."""
        try:
            line = os.read(self._report, 4096).decode(errors="replace").strip()
        except BlockingIOError:
            return None
        os.close(self._report)
        self._report = -1
        if line == "ready":
            self._serving = True
            self._ready_at = time.monotonic()
            return None
        if line.startswith("error "):
            return line[len("error ") :]
        code = self._proc.wait() if self._proc is not None else None
        return f"the KServe frontends' process exited ({_exit_text(code)}) before serving"

    def tick(self, now: float) -> None:
        """Notice an end (``on_exit``, then a restart after the back-off) and a restarted
        process's report; never waits."""
        if self._report >= 0 and select.select([self._report], [], [], 0)[0]:
            why = self._read_report()
            if why is not None:
                log.error("the KServe frontends could not be restarted: %s", why)
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            self._ended(proc.returncode, now)
        if self._restart_at is not None and now >= self._restart_at:
            self._restart_at = None
            log.info("restarting the KServe frontends")
            self._spawn()

    def _ended(self, code: int, now: float) -> None:
        if self._serving and now - self._ready_at >= STEADY_S:
            self._backoff = RESTART_S  # it had served a while: a crash, not a crash loop
        delay = self._backoff
        self._backoff = min(self._backoff * 2, RESTART_MAX_S)
        if self._serving:  # a crash, not a failed start (logged as it was read)
            log.error(
                "the KServe frontends' process exited (%s): its calls in flight failed; "
                "restarting it in %gs",
                _exit_text(code),
                delay,
            )
        self._close_pipes()
        self._proc = None
        self._serving = False
        self._on_exit()
        self._restart_at = now + delay

    def close(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``); idempotent."""
        self._restart_at = None
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error("the KServe frontends did not stop in %gs: killed", STOP_TIMEOUT_S)
                proc.kill()
                proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for fd in (self._lifeline, self._report):
            if fd >= 0:
                os.close(fd)
        self._lifeline = self._report = -1


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
