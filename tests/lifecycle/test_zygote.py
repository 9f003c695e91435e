"""Workers forked from a zygote: who is whose parent, what a respawn and a dead zygote do, and
that ``--worker-start fresh`` still starts each worker as the broker's own child."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lifecycle.helpers import NAP, act, instance, send_act, write_act_model
from tests.support import Server, serving, wait_until


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def act_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    write_act_model(repo, "act", "instance_group [ { count: 2 kind: KIND_CPU } ]")
    return repo


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(act_repo)


def zygote_of(server: Server) -> int:
    parents = {parent_of(pid) for pid in server.worker_pids()}
    assert len(parents) == 1, parents
    (zygote,) = parents
    assert parent_of(zygote) == server.proc.pid
    with open(f"/proc/{zygote}/cmdline", "rb") as f:
        assert b"inferpool.workers.zygote" in f.read()
    return zygote


def test_workers_are_forked_from_one_zygote_the_broker_started(server: Server) -> None:
    zygote = zygote_of(server)
    with server.client() as c:
        info = act(c, "act")
    assert parent_of(info["pid"]) == zygote
    assert info["affinity"] == instance(server.client(), info["instance"])["placement"]["cpus"]


def test_a_killed_worker_is_forked_again_and_its_exit_reported(server: Server) -> None:
    zygote = zygote_of(server)
    with server.client() as c:
        old = instance(c, "act_0_0")
        os.kill(old["pid"], signal.SIGKILL)
        new = wait_until(
            lambda: (
                (r := instance(c, "act_0_0"))["state"] == "READY"
                and r["pid"] not in (None, old["pid"])
                and r
            ),
            what="act_0_0 back",
        )
    assert new and parent_of(new["pid"]) == zygote
    assert "died with signal SIGKILL" in new["last_error"]  # the zygote reported the code


def test_a_dead_zygote_takes_its_workers_and_a_new_one_serves(server: Server) -> None:
    zygote = zygote_of(server)
    with server.client() as c:
        rid = send_act(c, "act", NAP)  # in flight when its worker goes
        wait_until(lambda: any(r["busy"] for r in c.status()), what="the nap executing")
        os.kill(zygote, signal.SIGKILL)
        reply, _ = c._recv(rid, 30)
        assert reply["error"]["code"] == "UNAVAILABLE", reply
        assert "ended with its zygote" in reply["error"]["message"]
        wait_until(
            lambda: all(r["state"] == "READY" and r["pid"] for r in c.status()),
            what="every instance back",
        )
        rows = c.status()
        assert all("ended with its zygote" in r["last_error"] for r in rows), rows
        assert act(c, "act")["value"] == 1
    assert zygote_of(server) != zygote


def test_fresh_workers_are_the_brokers_children(short_tmp: Path) -> None:
    with Server(short_tmp, act_repo(short_tmp), "--worker-start", "fresh") as server:
        pids = server.worker_pids()
        assert pids and all(parent_of(pid) == server.proc.pid for pid in pids)
        with server.client() as c:
            assert act(c, "act")["value"] == 1
        assert server.stop() == 0
