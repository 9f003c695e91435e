"""Lease tokens (owners, staleness, reclaim) and the region references work items carry."""

from __future__ import annotations

import pytest

from inferpool.shm.leases import LeaseTable
from inferpool.shm.refs import CUDA_IPC_HANDLE_SIZE, cuda_ref, parse_ref, posix_name, system_ref

A, B = b"client-a", b"client-b"


def test_leases_end_once_and_only_for_their_owner() -> None:
    table = LeaseTable("0123456789")
    t1 = table.grant(A, "inferpool-0123456789-out0g0", 0)
    t2 = table.grant(A, "inferpool-0123456789-out0g0", 64)
    t3 = table.grant(B, "inferpool-0123456789-out0g0", 128)
    assert len({t1, t2, t3}) == 3 and all(t.startswith("0123456789.") for t in (t1, t2, t3))
    assert len(table) == 3 and table.held_by(A) == 2

    ended, bad = table.release(B, [t1])  # another client's token is not B's to end
    assert ended == [] and bad == [t1] and table.held_by(A) == 2

    ended, bad = table.release(A, [t1, t1, "forged", 7, t3])
    assert [lease.offset for lease in ended] == [0]
    assert bad == [t1, "forged", 7, t3]  # stale, forged, malformed, someone else's
    assert table.held_by(B) == 1

    assert [lease.offset for lease in table.reclaim(A)] == [64]
    assert table.reclaim(A) == [] and table.held_by(A) == 0
    assert table.release(A, [t2]) == ([], [t2])  # reclaimed is stale too
    assert len(table) == 1 and table.owners() == [B]


def test_tokens_of_another_run_are_not_found() -> None:
    old = LeaseTable("aaaaaaaaaa").grant(A, "r", 0)
    new = LeaseTable("bbbbbbbbbb")
    new.grant(A, "r", 0)
    assert new.release(A, [old]) == ([], [old])


def test_region_references_round_trip() -> None:
    assert posix_name("/input_data") == "input_data" and posix_name("x") == "x"
    assert parse_ref("inferpool-0123456789-arena").kind == "posix"
    ref = parse_ref(system_ref(3, "/input_data", (45, 1207), 4096, 64))
    assert (ref.kind, ref.name, ref.inode, ref.offset, ref.byte_size) == (
        "sys",
        "input_data",
        (45, 1207),
        4096,
        64,
    )
    # the same key registered again is a different reference (a worker maps it afresh)
    assert system_ref(3, "/k", (1, 2), 0, 8) != system_ref(4, "/k", (1, 2), 0, 8)
    handle = bytes(range(CUDA_IPC_HANDLE_SIZE))
    # the registered size, for the worker's check, and the GPU as CUDA_VISIBLE_DEVICES names it
    for gpu in ("3", "GPU-5c0c3a9e-8b0f-4d0c-9d1c-0f1e2d3c4b5a", "MIG-GPU-5c0c3a9e/1/0"):
        ref = parse_ref(cuda_ref(9, 4096, handle, gpu))
        assert (ref.kind, ref.byte_size, ref.handle, ref.gpu) == ("cuda", 4096, handle, gpu)


@pytest.mark.parametrize(
    "bad",
    [
        "sys/1",
        "sys/1/a/b",
        "sys/1/2.3/0/x/k",
        "sys/1/23/0/8/k",
        "cuda/1/0/abcd/0",
        "cuda/1/x/" + "00" * 64 + "/0",
        "cuda/1/0/" + "00" * 64,  # no GPU
        "cuda/1/0/" + "0g" * 64 + "/0",
        "nfs/1/x",
    ],
)
def test_malformed_references_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not a region reference"):
        parse_ref(bad)
