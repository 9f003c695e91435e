"""A client's object as a worker maps it (shm.window): one that shrank before the mapping,
or between the size check and the mapping (the client truncated it at that moment), is
refused as shrunk, in the words a request's error carries."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from inferpool.shm import window
from inferpool.shm.refs import system_ref
from inferpool.wire.errors import InferpoolError
from inferpool.workers import memory

SIZE = 1 << 16


@pytest.fixture
def obj() -> Iterator[tuple[str, tuple[int, int]]]:
    """A client's object of SIZE bytes: its name and (st_dev, st_ino)."""
    name = f"ipt-window-{os.getpid()}-{secrets.token_hex(3)}"
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, SIZE)
        st = os.fstat(fd)
        yield name, (st.st_dev, st.st_ino)
    finally:
        os.close(fd)
        os.unlink(path)


def test_an_object_shrunk_before_it_is_mapped_is_refused(obj) -> None:
    name, inode = obj
    os.truncate(f"/dev/shm/{name}", 0)
    with pytest.raises(window.ObjectChanged, match="shrank to 0 bytes"):
        window.ObjectWindow(name, inode, 0, SIZE)


def test_an_object_shrunk_between_the_check_and_the_mapping_is_refused_as_shrunk(
    obj, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, inode = obj
    real = window.open_object

    def checked_then_shrunk(*args: Any, **kwargs: Any) -> Any:
        opened = real(*args, **kwargs)  # its size seen whole
        os.truncate(f"/dev/shm/{name}", 0)  # the client, right then
        return opened

    monkeypatch.setattr(window, "open_object", checked_then_shrunk)
    with pytest.raises(InferpoolError) as err:  # as a worker maps a request's region
        memory._open(system_ref(1, name, inode, 0, SIZE))
    assert err.value.code.value == "INVALID_ARG"
    assert f"'/{name}' shrank to 0 bytes" in err.value.message, err.value.message
