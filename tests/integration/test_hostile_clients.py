"""Clients that attack the server: names that could crash it, memory that is not theirs.

One real server for the module (identity models of the example repository) on ipc and tcp;
the POSIX objects are made by the test as a client would make them.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferpool.client import Client, InferpoolError
from tests.support import EXAMPLES, Server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    try:
        with Server(tmp, EXAMPLES, "--max-client-shm", "8M", tcp=True) as srv:
            yield srv
        assert srv.proc.returncode == 0, srv.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def refused(c: Client, **fields: object) -> InferpoolError:
    with pytest.raises(InferpoolError) as err:
        c.call("register_system_shared_memory", name="r", byte_size=8, **fields)
    return err.value


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_keys_that_are_not_posix_names_are_invalid_arg_naming_the_key(server, transport) -> None:
    endpoint = server.ipc if transport == "ipc" else server.tcp
    with Client(endpoint, timeout=10) as c:
        for key in ["/x\u0000y", "\u0000", ".", "..", "/", "//", "/" + "k" * 300]:
            err = refused(c, key=key)
            assert err.code.value == "INVALID_ARG", (key, err)
            assert repr(key) in err.message and "not a valid" in err.message, err.message
        assert c.is_live()
    assert server.proc.poll() is None
