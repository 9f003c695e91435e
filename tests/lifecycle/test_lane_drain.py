"""A drain ends the lanes: once admissions stop, a lane's requests meet the drain on the
broker path (UNAVAILABLE, naming it), as every other request does, and no lane is granted."""

from __future__ import annotations

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from tests.node_support import gated_repo, send_held
from tests.support import Server, identity_config, wait_until, write_model


def test_a_drain_revokes_lanes_and_refuses_new_ones(short_tmp) -> None:
    repo, gate = gated_repo(short_tmp)
    (gate / "load").touch()
    write_model(repo, "plain", identity_config("plain"))
    with Server(short_tmp, repo, "--drain-timeout", "30") as server:
        with Client(server.endpoint, timeout=10) as c, ShmClient(server.endpoint) as s:
            lane = s.lane("plain")
            req = s.request("plain", outputs=["OUTPUT0"])
            req.input("INPUT0", (2,), np.float32)[:] = 5
            with s.run(req) as result:  # on the lane
                assert result["OUTPUT0"].tolist() == [5, 5]
            held = send_held(c)  # keeps the drain going until the gate opens
            wait_until(lambda: c.statistics()["inflight"] == 1, what="the held request admitted")
            assert c.drain()["draining"]
            wait_until(lambda: not lane.usable, what="the lane revoked")
            assert lane.header.reason() == (
                "UNAVAILABLE",
                "the server is draining (asked to drain)",
            )
            with pytest.raises(InferpoolError, match=r"draining \(asked to drain\)") as err:
                s.run(req)  # the broker path now, which admits nothing
            assert err.value.code.value == "UNAVAILABLE"
            with pytest.raises(InferpoolError, match="draining") as refused:
                s.lane("plain")
            assert refused.value.code.value == "UNAVAILABLE"
            (gate / "finish").touch()
            header, _ = c._recv(held, 30)
            assert "error" not in header, header
        assert server.proc.wait(30) == 0, server.log()
    assert not [r for r in server.regions() if "-lane" in r]
