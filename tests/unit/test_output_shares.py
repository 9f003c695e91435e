"""A client's share of output memory is its principal's: every connection of one process
counts together, at admission and when a response's outputs are sent (front.shares)."""

from __future__ import annotations

import pytest

from inferpool.broker.front.shares import OutputShares
from inferpool.wire.errors import Code, InferpoolError

MiB = 1 << 20
PRINCIPALS = {b"a1": "process 1", b"a2": "process 1", b"b1": "process 2"}


def test_a_connection_that_holds_nothing_is_over_when_its_process_is() -> None:
    shares = OutputShares(4 * MiB, PRINCIPALS.__getitem__)
    assert not shares.over(b"a2")
    shares.hold(b"a1", 4 * MiB)
    assert shares.over(b"a1") and shares.over(b"a2")  # admitted earlier, answered now: copied
    assert not shares.over(b"b1")
    with pytest.raises(InferpoolError, match="process 1 holds 4194304 bytes") as err:
        shares.admit(b"a2")
    assert err.value.code is Code.UNAVAILABLE
    shares.free(b"a1", MiB)
    assert not shares.over(b"a2")
    shares.admit(b"a2")
