"""The broker's table of shared regions (shm/shared.py), with real POSIX regions: one filler,
waiters attach once it is filled, a fill that dies passes on, the last user unlinks."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from inferpool.shm.region import Region
from inferpool.shm.runs import RunLock, regions_of_run
from inferpool.shm.shared import Grant, SharedRegionTable

KEY = "weights-0123456789abcdef"


@pytest.fixture
def table() -> Iterator[SharedRegionTable]:
    lock = RunLock()
    table = SharedRegionTable(lock.run_id)
    try:
        yield table
        table.close()
        assert regions_of_run(lock.run_id) == [lock.name], "regions left in /dev/shm"
    finally:
        table.close()
        lock.release()


def write(name: str, data: bytes) -> None:
    region = Region.attach(name)
    try:
        region.buf[: len(data)] = data
    finally:
        region.close()


def read(name: str, n: int) -> bytes:
    region = Region.attach(name)
    try:
        return bytes(region.buf[:n])
    finally:
        region.close()


def test_the_first_asker_fills_and_the_others_attach_once_it_is_filled(table) -> None:
    name = table.name_of(KEY)
    assert table.ask("a", KEY, 4096) == Grant("a", KEY, name, True)
    assert table.ask("b", KEY, 4096) is None  # waits for a's fill
    assert table.ask("c", KEY, 4096) is None
    assert os.stat(f"/dev/shm/{name}").st_mode & 0o777 == 0o600
    write(name, b"filled")
    assert table.filled("b", KEY, True) == []  # not b's to fill: nothing changes
    assert table.filled("a", KEY, True) == [
        Grant("b", KEY, name, False),
        Grant("c", KEY, name, False),
    ]
    assert table.ask("d", KEY, 4096) == Grant("d", KEY, name, False)  # filled: attach at once
    assert read(name, 6) == b"filled"


def test_a_fill_that_dies_or_gives_up_passes_to_the_next_waiter_on_a_fresh_region(table) -> None:
    name = table.name_of(KEY)
    table.ask("a", KEY, 4096)
    table.ask("b", KEY, 4096)
    table.ask("c", KEY, 4096)
    write(name, b"half")
    assert table.gone("a") == [Grant("b", KEY, name, True)]
    assert read(name, 4) == b"\0\0\0\0"  # what a half-done fill wrote is gone
    assert table.filled("b", KEY, False) == [Grant("c", KEY, name, True)]
    assert table.filled("c", KEY, True) == []
    assert table.names() == [name]


def test_a_fill_nobody_waits_for_ends_with_its_region(table) -> None:
    table.ask("a", KEY, 4096)
    assert table.gone("a") == []
    assert table.names() == []
    assert table.ask("b", KEY, 8192).fill  # starts over, at any size


def test_the_region_lives_until_its_last_user_is_released(table) -> None:
    table.ask("a", KEY, 4096)
    table.filled("a", KEY, True)
    table.ask("b", KEY, 4096)
    table.gone("a")  # a crashed and will be respawned: it still uses the region
    assert table.release("a") == []
    assert table.names() == [table.name_of(KEY)]
    table.release("b")
    assert table.names() == []
    assert not os.path.exists(f"/dev/shm/{table.name_of(KEY)}")


@pytest.mark.parametrize(
    ("key", "size", "problem"),
    [
        ("../etc", 4096, "is not 1-64 lowercase letters, digits and dashes"),
        ("Weights", 4096, "is not 1-64 lowercase"),
        ("x" * 65, 4096, "is not 1-64 lowercase"),
        (KEY, 0, "size 0 is not a positive number of bytes"),
        (KEY, "4096", "size '4096' is not a positive"),
        (KEY, 8192, "holds 4096 bytes, not the 8192 asked"),
    ],
)
def test_bad_keys_and_sizes_are_refused(table, key, size, problem) -> None:
    table.ask("a", KEY, 4096)
    with pytest.raises(ValueError, match=problem):
        table.ask("b", key, size)
    assert table.names() == [table.name_of(KEY)]
