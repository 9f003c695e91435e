"""Registered regions: per-client names, bounds, and retirement only after in-flight work."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest

from inferpool.broker.front.objects import may_read_write
from inferpool.broker.front.peers import Peer
from inferpool.broker.front.registrations import Registrations
from inferpool.shm.region import Region, exists
from inferpool.shm.runs import RunLock
from inferpool.wire.errors import Code, InferpoolError

A, B = b"client-a", b"client-b"
ME = Peer("ipc", os.getpid(), os.getuid(), frozenset({os.getgid()}))  # this process, over ipc


@pytest.fixture
def regs(shm_clean: None) -> Iterator[tuple[Registrations, dict[int, object], dict]]:
    lock = RunLock()
    inflight: dict[int, object] = {}
    unmaps: dict[str, list[str]] = {}
    r = Registrations(lock.run_id, 1 << 20, 1 << 21, False, inflight, lambda: ["w0", "w1"], unmaps)
    try:
        yield r, inflight, unmaps
    finally:
        r.close()
        lock.release()


@pytest.fixture
def user_object() -> Iterator[str]:
    """A POSIX object a client made (not an inferpool- name), 4096 bytes."""
    name = f"ipt-{os.getpid()}-{secrets.token_hex(3)}"
    region = Region.create(name, 4096, prefault=False)
    try:
        yield name
    finally:
        region.destroy()


def code_of(fn, *args) -> tuple[Code, str]:
    with pytest.raises(InferpoolError) as info:
        fn(*args)
    return info.value.code, info.value.message


def test_names_belong_to_their_client_and_windows_are_checked(regs, user_object) -> None:
    r, _, _ = regs
    r.register_system(A, "in", "/" + user_object, 1024, 2048, ME)
    assert r.status(A, "", False) == [
        {"name": "in", "key": "/" + user_object, "offset": 1024, "byte_size": 2048}
    ]
    assert code_of(r.register_system, A, "in", user_object, 0, 16, ME)[0] is Code.ALREADY_EXISTS
    r.register_system(B, "in", user_object, 0, 4096, ME)  # B's own "in": a different region

    def win(owner: bytes, nbytes: int | None, **params) -> tuple:
        return r.window(owner, "input", "X", {"shared_memory_region": "in", **params}, nbytes)

    reg, offset, size = win(A, 32, shared_memory_offset=16, shared_memory_byte_size=32)
    assert (offset, size) == (1040, 32) and reg.ref.startswith("sys/")
    code, msg = code_of(win, b"client-c", 4)
    assert code is Code.NOT_FOUND and "unable to find shared memory region: 'in'" in msg
    code, msg = code_of(lambda: win(A, 16, shared_memory_offset=2040, shared_memory_byte_size=16))
    assert code is Code.INVALID_ARG and "outside region 'in' of 2048 bytes" in msg
    code, msg = code_of(lambda: win(A, 16, shared_memory_byte_size=12))
    assert code is Code.INVALID_ARG and "input 'X'" in msg and "make 16 bytes" in msg
    code, msg = code_of(lambda: win(A, None, shared_memory_byte_size=-1))
    assert code is Code.INVALID_ARG and "non-negative integers" in msg


def test_bad_registrations_say_what_is_wrong(regs, user_object) -> None:
    r, _, _ = regs
    assert code_of(r.register_system, A, "x", "/nope-" + user_object, 0, 8, ME)[0] is Code.NOT_FOUND
    code, msg = code_of(r.register_system, A, "x", user_object, 4000, 100, ME)
    assert code is Code.INVALID_ARG and "exceeds the 4096 bytes" in msg
    code, msg = code_of(r.register_system, A, "x", f"/inferpool-{r.run_id}-arena", 0, 8, ME)
    assert code is Code.INVALID_ARG and "reserved" in msg
    code, msg = code_of(r.register_cuda, A, "g", b"short", 0, 8, ("0",))
    assert code is Code.INVALID_ARG and "64-byte" in msg
    code, msg = code_of(r.register_cuda, A, "g", bytes(64), 1, 8, ("0",))
    assert code is Code.INVALID_ARG and msg == (
        "failed to register CUDA shared memory region 'g': device_id 1 is not a GPU of this "
        "server, which has 1"
    )
    code, msg = code_of(r.create, A, "big", 2 << 20, "process 1")
    assert code is Code.INVALID_ARG and "--max-client-shm" in msg
    assert r.unregister(A, "x", False) == []  # an unknown name: nothing ended, no error (Triton)


def test_regions_retire_only_after_the_requests_admitted_before(regs, user_object) -> None:
    r, inflight, unmaps = regs
    created = r.create(A, "inputs", 64 << 10, "process 1")
    assert created.created is not None and exists(created.key)
    assert os.stat(f"/dev/shm/{created.key}").st_mode & 0o777 == 0o600
    r.register_system(A, "user", user_object, 0, 4096, ME)
    inflight[7] = object()  # a request admitted before the client went away
    assert r.drop_owner(A) == 2
    assert r.status(A, "", False) == []  # the names are gone at once...
    assert exists(created.key) and unmaps == {}  # ...the memory is not
    inflight[8] = object()  # admitted later: does not hold the old regions
    del inflight[7]
    r.tick()
    assert not exists(created.key)
    refs = sorted(unmaps["w0"])
    assert refs == sorted(unmaps["w1"]) and len(refs) == 2
    assert exists(user_object)  # the client's own object is the client's to unlink


def cuda_ref_of(r: Registrations, name: str) -> str:
    """The reference a request naming region ``name`` of client A carries to its worker."""
    params = {"shared_memory_region": name, "shared_memory_byte_size": 16}
    return r.window(A, "input", "x", params, None)[0].ref


def test_a_cuda_unregister_is_answered_once_every_worker_that_opened_it_closed_it() -> None:
    inflight: dict[int, object] = {}
    unmaps: dict[str, list[str]] = {}
    workers = ["w0", "w1", "w2"]
    r = Registrations("0123456789", 0, 0, False, inflight, lambda: list(workers), unmaps)
    r.register_cuda(A, "g", bytes(64), 0, 4096, ("0",))
    ref = cuda_ref_of(r, "g")
    assert ref.startswith("cuda/") and ref.endswith("/0")
    inflight[7] = object()  # a request that may read the region...
    r.mapped("w0", [ref])  # ...and the workers that opened it (w2, busy elsewhere, did not)
    r.mapped("w1", [ref])
    answers: list[list[str]] = []
    assert r.unregister(A, "", True, answers.append) == ["g"]
    r.tick()
    assert answers == [] and unmaps == {}  # the request still runs: nothing retired yet
    del inflight[7]
    r.tick()
    assert unmaps == {"w0": [ref], "w1": [ref]}  # only the workers that opened it are told
    r.unmapped("w0", [ref])
    assert answers == []  # w1 still maps it: the client must not free the memory yet
    r.unmapped("w1", ["sys/3/other", ref])
    assert answers == [["g"]]  # w2 holds nothing up
    # a worker that opened a region and died has closed it
    r.register_cuda(A, "h", bytes(64), 0, 4096, ("0",))
    r.mapped("w2", [cuda_ref_of(r, "h")])
    r.unregister(A, "h", True, answers.append)
    assert answers == [["g"]]
    workers.remove("w2")
    r.tick()
    assert answers == [["g"], ["h"]]
    # a region no worker opened is answered at once, and no worker is told of it
    unmaps.clear()
    r.register_cuda(A, "k", bytes(64), 0, 4096, ("0",))
    late = cuda_ref_of(r, "k")
    r.unregister(A, "k", True, answers.append)
    assert answers[-1] == ["k"] and unmaps == {}
    r.mapped("w1", [late])  # word of a region already ended: it is told to close it
    assert unmaps == {"w1": [late]}
    assert r.unregister(A, "", True, answers.append) == [] and answers[-1] == []


@pytest.mark.parametrize(
    "mode, owner, group, uid, gids, allowed",
    [
        (0o600, 1000, 1000, 1000, {1000}, True),  # its own
        (0o400, 1000, 1000, 1000, {1000}, False),  # its own, read-only: no
        (0o600, 1000, 1000, 2000, {1000}, False),  # another user's, group has nothing
        (0o660, 1000, 50, 2000, {50}, True),  # shared with a group it is in
        (0o660, 1000, 50, 2000, {51}, False),  # ... and one it is not in
        (0o606, 1000, 50, 2000, {50}, False),  # group bits apply to members, not others'
        (0o666, 1000, 1000, 2000, set(), True),  # open to all
        (0o000, 1000, 1000, 0, set(), True),  # root opens anything
    ],
)
def test_a_client_may_register_what_its_user_could_open(mode, owner, group, uid, gids, allowed):
    st = os.stat_result((0o100000 | mode, 1, 1, 1, owner, group, 4096, 0, 0, 0))
    assert may_read_write(st, uid, frozenset(gids)) is allowed
