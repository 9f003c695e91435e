"""The KServe frontends' process: ``python -m inferpool.broker.kserve.frontends CONFIG``.

The broker starts it (``kserve.process``) with a :class:`~inferpool.broker.kserve.frontend_options.
ProcessConfig` as its one argument.  It binds its listeners, connects to the broker's socket
for it, then writes one line on its report pipe: ``ready``, or ``error <message>`` (a port
in use, in the words the broker's start fails with).  It serves until SIGTERM or until its
standard input, a pipe whose other end only the broker holds, reads end-of-file: the broker
is gone, however it died, and the frontends go with it.  Ctrl-C is the broker's to handle.

Its loop is uvloop's where uvloop is installed (aiohttp's per-request cost about halves),
asyncio's own otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from typing import Any

import zmq

from inferpool.broker.kserve.broker_channel import BrokerChannel
from inferpool.broker.kserve.frontend_options import ProcessConfig
from inferpool.broker.kserve.input_region import Inputs
from inferpool.broker.kserve.service import Listeners
from inferpool.wire.caller import unidentified
from inferpool.wire.errors import InferpoolError
from inferpool.wire.logs import apply, configure, serving, settings_from

log = logging.getLogger("inferpool.kserve")
EXIT_OK = 0
EXIT_CANNOT_SERVE = 3  # a listener could not be bound: the report line says which and why
LIFELINE_FD = 0  # standard input: end-of-file once the broker is gone


def main(argv: list[str] | None = None) -> int:
    """Serve until the broker stops the process or is gone; the exit code."""
    config = ProcessConfig.from_json((argv if argv is not None else sys.argv[1:])[0])
    os.setpgid(0, 0)  # a signal to the server's group is the broker's: it stops this one
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    label = f"kserve pid {os.getpid()}"  # (its start is in the broker's summary: quiet)
    configure(settings_from(config.log), label, {"process": "kserve"}, starting=True)
    loop = _new_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(_serve(config))
    finally:
        loop.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def _serve(config: ProcessConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(LIFELINE_FD, _on_lifeline, stop)
    ctx: zmq.Context[Any] = zmq.Context()
    channel = BrokerChannel(ctx, config.endpoint)
    channel.attach(loop)
    inputs = Inputs(config.input_region)
    try:
        listeners = Listeners(channel, config.options, inputs)
        try:
            await listeners.start()
        except InferpoolError as err:
            _report(config.report_fd, f"error {err.message}")
            return EXIT_CANNOT_SERVE
        _report(config.report_fd, "ready")
        serving()
        watch = {"type": "log_watch"}  # a client's change of the log settings reaches us here
        channel.open(unidentified("kserve"), watch, (), _log_change)
        await stop.wait()
        await listeners.close()
        return EXIT_OK
    finally:
        channel.close()
        inputs.close()
        ctx.term()


def _log_change(reply: dict[str, Any], frames: list[Any]) -> None:
    """The broker's answer to our ``log_watch``: the log settings a client changed."""
    if isinstance(reply.get("settings"), dict):
        apply(settings_from(reply["settings"]))


def _on_lifeline(stop: asyncio.Event) -> None:
    with contextlib.suppress(BlockingIOError):
        if os.read(LIFELINE_FD, 64):
            return  # the broker never writes; nothing to do but wait for the end
    asyncio.get_running_loop().remove_reader(LIFELINE_FD)
    log.info("the broker is gone: the frontends stop")
    stop.set()


def _report(fd: int, line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
        os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
