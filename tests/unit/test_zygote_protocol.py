"""The fork protocol (wire/worker/fork_protocol.py) and the broker's fallback when a zygote refuses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types

import pytest

from inferpool.broker.pool.zygotes import ForkedProcess
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker import fork_protocol as z
from inferpool.wire.worker.spec import EXIT_BROKER_GONE, PinningSpec
from tests.unit.test_worker_protocol import SPEC


def test_messages_and_fds_travel_whole() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        for msg in (z.Fork(1, '{"x": 1}'), z.Forked(1, 4242), z.Refused(2, {"code": "X"})):
            z.send(a, msg)
            assert z.recv(b) == (msg, [])
        z.send(a, z.Exited(4242, -9), [w])
        got = z.recv(b)
        assert got is not None
        exited, fds = got
        assert exited == z.Exited(4242, -9) and len(fds) == 1
        os.write(fds[0], b"!")  # the same pipe, through another descriptor
        assert os.read(r, 1) == b"!"
        os.close(fds[0])
        a.send(b'["launch", []]')
        with pytest.raises(InferpoolError, match="unreadable zygote message: KeyError"):
            z.recv(b)
        a.close()
        assert z.recv(b) is None
    finally:
        for fd in (r, w):
            os.close(fd)
        b.close()


def test_a_zygote_spec_is_read_back_or_refused_by_name() -> None:
    spec = z.ZygoteSpec("node0", 42, 7, PinningSpec([0, 1], 0, "bind"), {"verbose": 1})
    assert z.read_zygote_spec(z.zygote_environment(spec)) == spec
    with pytest.raises(InferpoolError, match="is not set: zygotes are started by the broker"):
        z.read_zygote_spec({})
    with pytest.raises(InferpoolError) as info:
        z.read_zygote_spec({z.ZYGOTE_ENV: '{"name": "x"}'})
    assert info.value.code is Code.INTERNAL


def test_a_zygote_with_cuda_up_refuses_to_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferpool.workers.zygote import _check_no_cuda

    cuda = types.SimpleNamespace(is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    _check_no_cuda()
    cuda.is_initialized = lambda: True
    with pytest.raises(InferpoolError, match="CUDA was initialised in the zygote"):
        _check_no_cuda()


def test_a_refused_worker_starts_fresh() -> None:
    """The broker starts the worker as a fresh interpreter, on the same channel end."""
    zygote = types.SimpleNamespace(alive=True, name="any")
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    proc = ForkedProcess(zygote, SPEC, child.fileno())  # type: ignore[arg-type]
    child.close()
    assert proc.pid is None and proc.poll() is None
    proc.refused("CUDA was initialised in the zygote")
    assert proc.pid is not None
    # the spec names another parent: the fresh worker exits at once with EXIT_BROKER_GONE
    assert proc.wait(60) == EXIT_BROKER_GONE
    parent.close()


def test_a_zygote_logs_in_the_brokers_format() -> None:
    """Under --log-format json a zygote's lines are JSON too, named as the zygote's."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    spec = z.ZygoteSpec("any", os.getpid(), theirs.fileno(), PinningSpec(), {"format": "json"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferpool.workers.zygote"],
        env={**os.environ, **z.zygote_environment(spec)},
        pass_fds=[theirs.fileno()],
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    theirs.close()
    ours.send(b'["launch", []]')  # not a message: the zygote logs it and goes on
    ours.close()  # the broker is gone: the zygote ends
    _, err = proc.communicate(timeout=60)
    [line] = [json.loads(text) for text in err.splitlines()]
    assert (line["level"], line["process"], line["zygote"]) == ("ERROR", "zygote", "any")
    assert "unreadable zygote message" in line["message"]
