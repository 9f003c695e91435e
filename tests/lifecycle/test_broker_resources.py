"""What a broker makes, it unmakes: a start that fails part-way and an orderly close both
leave no region, no socket path and no signal handler of theirs behind.

The broker is built in this test's process (its constructor makes the whole run), so the
test can look at the signal handlers it installed and restored.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
from pathlib import Path

import pytest

from inferpool.broker.options import ServerOptions
from inferpool.broker.server import SIGNALS, Broker
from inferpool.shm.runs import regions_of_run, run_is_alive
from inferpool.wire.errors import Code, InferpoolError
from tests.support import identity_config, write_model

MiB = 1 << 20


def options(tmp: Path, *listen: str) -> ServerOptions:
    repo = tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    return ServerOptions(
        model_repository=str(repo),
        listen=listen,
        run_dir=str(tmp / "run"),
        arena_size=MiB,
        output_arena_size=MiB,
        prefault=0,
    )


def handlers() -> dict[int, object]:
    return {sig: signal.getsignal(sig) for sig in SIGNALS}


def test_a_start_that_fails_part_way_undoes_what_it_made(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    mine = short_tmp / "mine.sock"
    before = handlers()
    with socket.socket() as taken:  # another program's port: the metrics cannot be served
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        opts = dataclasses.replace(options(short_tmp, f"ipc://{mine}"), metrics_port=port)
        with (
            caplog.at_level(logging.INFO, "inferpool.broker"),
            pytest.raises(InferpoolError) as err,
        ):
            Broker(opts)
        assert err.value.code is Code.UNAVAILABLE
        assert f"cannot serve metrics on 127.0.0.1:{port}: Address already in use" in str(err.value)
    said = [r.getMessage() for r in caplog.records]
    (run_id,) = [m.split()[1].rstrip(":") for m in said if m.startswith("run ")]
    assert f"listening on ipc://{mine}" in said  # it got that far
    assert not run_is_alive(run_id) and regions_of_run(run_id) == []
    assert not mine.exists()
    assert handlers() == before
    assert signal.set_wakeup_fd(-1) == -1  # no wakeup fd was left installed


def test_a_taken_endpoint_fails_the_start_before_a_run_begins(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A second server on the same endpoint says so before it touches shared memory."""
    mine, taken = short_tmp / "mine.sock", short_tmp / "taken.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(taken))  # another server's socket
        other.listen()
        with (
            caplog.at_level(logging.INFO, "inferpool.broker"),
            pytest.raises(InferpoolError) as err,
        ):
            Broker(options(short_tmp, f"ipc://{mine}", f"ipc://{taken}"))
        assert err.value.message == f"cannot listen on ipc://{taken}: another server is using it"
        assert taken.exists()  # the other server's path is not ours to remove
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if m.startswith(("run ", "removed "))]  # no run, no sweep
    assert not mine.exists()


def test_close_releases_the_run_and_may_be_called_again(short_tmp: Path) -> None:
    endpoint = short_tmp / "broker.sock"
    before = handlers()
    broker = Broker(options(short_tmp, f"ipc://{endpoint}"))
    assert run_is_alive(broker.run_id)
    assert sorted(name.rsplit("-", 1)[1] for name in regions_of_run(broker.run_id)) == [
        "arena",
        "cancel",
        "lock",
    ]
    assert endpoint.exists() and handlers() != before
    broker.close()
    broker.close()
    assert not run_is_alive(broker.run_id) and regions_of_run(broker.run_id) == []
    assert not endpoint.exists() and not os.listdir(short_tmp / "run")
    assert handlers() == before
