"""How the frontends name their callers: the caller frame, the owner of a loopback socket
(real sockets, the kernel's answer), and what the broker makes of the frame."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from inferpool.broker.front.peers import KSERVE_TAG, caller_peer, require_access
from inferpool.broker.kserve.callers import Callers, groups
from inferpool.broker.kserve.socket_owner import SocketOwners
from inferpool.wire import caller
from inferpool.wire.errors import InferpoolError


@pytest.fixture
def owners() -> Iterator[SocketOwners]:
    found = SocketOwners()
    yield found
    found.close()


def connected(host: str) -> tuple[socket.socket, socket.socket, socket.socket]:
    """A listener on ``host``, a client connected to it and the accepted end."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family)
    listener.bind((host, 0))
    listener.listen()
    client = socket.socket(family)
    client.connect(listener.getsockname()[:2])
    accepted, _ = listener.accept()
    return listener, client, accepted


def test_the_caller_frame_round_trips() -> None:
    assert caller.parse(caller.identified(1000, [27, 4, 27])) == caller.Caller(
        1000, frozenset({4, 27})
    )
    assert caller.parse(caller.unidentified("10.1.2.3")) == caller.Caller(host="10.1.2.3")
    with pytest.raises(ValueError, match="not a caller frame"):
        caller.parse(b"pid:1")


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_loopback_clients_socket_is_its_users(owners: SocketOwners, host: str) -> None:
    listener, client, accepted = connected(host)
    with listener, client, accepted:
        mine, theirs = client.getsockname()[:2], client.getpeername()[:2]
        assert owners.owner(mine, theirs) == os.geteuid()
        # no connection from the listener's address to another port: the kernel falls back
        # to the listener there, which is nobody's connection
        assert owners.owner(theirs, (mine[0], mine[1] % 65535 + 1)) is None
        callers = Callers(owners)
        assert callers.of(mine, theirs) == caller.identified(os.geteuid(), groups(os.geteuid()))


def test_a_socket_its_process_closed_names_nobody(owners: SocketOwners) -> None:
    """Once closed by its process, a socket no longer has an owner (the kernel reports uid
    0, root's, for it): a client that sends and closes at once must not pass for root."""
    listener, client, accepted = connected("127.0.0.1")
    with listener, accepted:
        mine, theirs = client.getsockname()[:2], client.getpeername()[:2]
        client.close()
        assert owners.owner(mine, theirs) is None
        assert Callers(owners).of(mine, theirs) == caller.unidentified("127.0.0.1")


class _Call:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


def test_grpc_callers_are_identified_only_on_a_listener_of_one_address(
    owners: SocketOwners,
) -> None:
    listener, client, accepted = connected("127.0.0.1")
    with listener, client, accepted:
        port = client.getsockname()[1]
        local = listener.getsockname()[1]
        callers = Callers(owners)
        call = _Call(f"ipv4:127.0.0.1:{port}")
        uid = os.geteuid()
        assert callers.of_grpc(call, "127.0.0.1", local) == caller.identified(uid, groups(uid))
        # gRPC does not say which local address was reached: on a wildcard, no guess
        assert callers.of_grpc(call, "0.0.0.0", local) == caller.unidentified("127.0.0.1")
        assert callers.of_grpc(_Call("unix:/tmp/x"), "127.0.0.1", local) == caller.unidentified(
            "unknown"
        )
        assert callers.of_grpc(_Call("ipv6:%5B::1%5D:1"), "::1", local) == caller.unidentified(
            "::1"
        )  # no such connection


def test_another_hosts_caller_may_register_nothing() -> None:
    peer = caller_peer(KSERVE_TAG + caller.unidentified("10.1.2.3"))
    assert peer.principal == "host 10.1.2.3 over HTTP/gRPC"
    with pytest.raises(InferpoolError, match=r"cannot identify \(host 10\.1\.2\.3 ") as err:
        require_access(peer, "register shared memory")
    assert err.value.code.name == "UNSUPPORTED"
    known = caller_peer(KSERVE_TAG + caller.identified(1000, [1000, 27]))
    assert known.principal == "uid 1000 over HTTP/gRPC"
    assert require_access(known, "register shared memory") == 1000
    assert known.gids == frozenset({1000, 27})
