"""The shared-memory extension of the broker's front.

Its messages (Triton's system and CUDA shared-memory messages, the server-made client
region, lease release, keep-alive and lease status) are handlers of the router; it is the
admission hook for inputs and outputs in shared memory and sees every inference request
first (``front.inference``); and it ends what a client held when the client goes away.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import zmq

from inferpool.broker.front.clients import ClientTracker
from inferpool.broker.front.handles import Handles
from inferpool.broker.front.peers import SECURE_TAG, UNKNOWN, Peer, require_access
from inferpool.broker.front.registrations import Registrations
from inferpool.broker.front.router import Handler
from inferpool.shm import cuda
from inferpool.wire.errors import Code, InferpoolError, invalid_arg
from inferpool.wire.worker.protocol import Window

log = logging.getLogger("inferpool.shm")
EXTENSIONS = ("system_shared_memory", "cuda_shared_memory", "output_handles")


class LaneEnds(Protocol):
    """What the lanes (``front.lane_grants``) hear of their clients and input regions ending."""

    def client_gone(self, owner: bytes, why: str) -> None: ...

    def region_ended(self, owner: bytes, name: str) -> None: ...


class SharedMemory:
    """The extension's messages and the admission hook (``front.inference.SharedMemoryHook``)."""

    def __init__(
        self,
        registrations: Registrations,
        handles: Handles,
        sockets: Sequence[zmq.Socket[Any]],
        lease_timeout: float,
        send: Callable[[list[Any], dict[str, Any]], None],
        gpus: Sequence[str],
        gone: Callable[[bytes], None],
        lanes: LaneEnds,
    ) -> None:
        """``sockets``: the clients' ROUTERs, whose disconnects end what a client held;
        ``lease_timeout``: how long a client holding leases may stay silent; ``send``: the
        responder's, for answers that come later (a CUDA unregister); ``gpus``: the
        ``CUDA_VISIBLE_DEVICES`` entry of each GPU the broker counted (without CUDA), by the
        server's device number; ``gone(client)``: a client that sent inference
        requests disconnected (its requests are cancelled); ``lanes`` end with the client
        (disconnected or silent) and with their input region."""
        self.registrations = registrations
        self.handles = handles
        self._send = send
        self.gpus = gpus
        self._gone = gone
        self.lanes = lanes
        self.clients = ClientTracker(sockets, lease_timeout, self._disconnected, self._silent)
        self._source: Any = None  # the routing frame of the message being handled

    def handlers(self) -> dict[str, Handler]:
        return {
            "register_system_shared_memory": self.register_system,
            "unregister_system_shared_memory": self.unregister_system,
            "system_shared_memory_status": self.system_status,
            "create_shared_memory_region": self.create_region,
            "register_cuda_shared_memory": self.register_cuda,
            "unregister_cuda_shared_memory": self.unregister_cuda,
            "cuda_shared_memory_status": self.cuda_status,
            "release_leases": self.release_leases,
            "keepalive": self.keepalive,
            "lease_status": self.lease_status,
        }

    def arrived(self, source: Any) -> None:
        """The router's: the routing frame of each message, which names its connection."""
        self._source = source

    # ------------------------------------------------------------------ admission hook
    def resolve_input(
        self, client: bytes, name: str, params: dict[str, Any], nbytes: int | None
    ) -> tuple[str, int, int]:
        reg, offset, size = self.registrations.window(client, "input", name, params, nbytes)
        return reg.ref, offset, size

    def resolve_output(self, client: bytes, name: str, params: dict[str, Any]) -> Window | None:
        handle = params.get("output_handle", False)
        if not isinstance(handle, bool):
            raise invalid_arg(f"output '{name}': output_handle must be a boolean, got {handle!r}")
        if "shared_memory_region" in params:
            if handle:
                raise invalid_arg(
                    f"output '{name}' asks for both a handle and a shared-memory region; choose one"
                )
            reg, offset, size = self.registrations.window(client, "output", name, params, None)
            return Window(reg.ref, offset, size)
        if handle:
            self._track(client)
        return None

    def request_arrived(self, client: bytes, header: dict[str, Any]) -> None:
        """Releases carried by an inference request come first, then the request itself,
        whose sender is watched from now on (its requests end when it disconnects), unless
        its client is over its share of output memory."""
        release = header.get("release")
        if release:
            self.handles.release(client, release)
        self.clients.active(client, self._source)  # its peer is known from now on, for
        self.handles.shares.admit(client)  # its outputs' share

    def peer(self, client: bytes) -> Peer:
        """Who ``client``, the sender of the message being handled, is."""
        return self.clients.peer(client, self._source)

    def principal(self, client: bytes) -> str:
        """Whose limits ``client`` counts against (a connection looked at already)."""
        return (self.clients.known(client) or UNKNOWN).principal

    # ------------------------------------------------------------------ system regions
    def register_system(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        name = _text(h, "name")
        key, offset, size = _text(h, "key"), _count(h, "offset", 0), _count(h, "byte_size")
        peer = self._track(e[0])
        self.registrations.register_system(e[0], name, key, offset, size, peer)
        return {}

    def create_region(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        name = _text(h, "name")
        size = _count(h, "byte_size")
        if size == 0:
            raise invalid_arg("create_shared_memory_region needs a byte_size above 0")
        peer = self._track(e[0])
        require_access(peer, "create shared-memory regions")
        reg = self.registrations.create(e[0], name, size, peer.principal)
        return {"key": "/" + reg.key, "byte_size": reg.byte_size}

    def unregister_system(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        names = self.registrations.unregister(e[0], _opt_text(h, "name"), False)
        for name in names:  # a lane reads its inputs from a server-made region
            self.lanes.region_ended(e[0], name)
        return {"unregistered": names}

    def system_status(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        return {"regions": self.registrations.status(e[0], _opt_text(h, "name"), False)}

    # ------------------------------------------------------------------ CUDA regions
    def register_cuda(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        name = _text(h, "name")
        raw = _text(h, "raw_handle")
        try:
            handle = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise invalid_arg(
                f"raw_handle of CUDA shared memory region '{name}' is not base64"
            ) from None
        device_id = _count(h, "device_id")
        size = _count(h, "byte_size")
        reason = cuda.support_reason(len(self.gpus))  # never CUDA itself on the event loop
        if reason is not None:
            raise InferpoolError(
                Code.UNSUPPORTED, f"CUDA shared memory is not available on this server: {reason}"
            )
        require_access(self._track(e[0]), "register CUDA shared memory")
        self.registrations.register_cuda(e[0], name, handle, device_id, size, self.gpus)
        return {}

    def unregister_cuda(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> None:
        """Answered once no worker maps the regions: the client may free the memory then."""
        request_id = h.get("id", "")

        def closed(names: list[str]) -> None:
            reply = {"type": h["type"], "id": request_id, "unregistered": names}
            self._send(e, reply)

        self.registrations.unregister(e[0], _opt_text(h, "name"), True, closed)

    def cuda_status(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        return {"regions": self.registrations.status(e[0], _opt_text(h, "name"), True)}

    # ------------------------------------------------------------------ leases
    def release_leases(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        self.clients.seen(e[0])
        leases = h.get("leases")
        if not isinstance(leases, list):
            raise invalid_arg("release_leases needs 'leases': a list of lease tokens")
        return {"released": self.handles.release(e[0], leases)}

    def keepalive(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        """Refresh the sender, or the client named by ``client`` (hex of its routing id): a
        connection of the same process (or tcp host) as the sender."""
        client = e[0]
        named = h.get("client")
        if named is not None:
            try:
                client = bytes.fromhex(named) if isinstance(named, str) else b""
            except ValueError:
                client = b""
            if not client:
                raise invalid_arg(f"keepalive 'client' must be a routing id in hex, got {named!r}")
            if e[0].startswith(SECURE_TAG):
                client = SECURE_TAG + client
            known = self.clients.known(client)
            if (
                known is not None
                and known.principal != self.clients.peer(e[0], self._source).principal
            ):
                raise invalid_arg(
                    f"keepalive may name only a connection of the sender's own {_whose(known)}"
                )
        self.clients.seen(client)
        return {"lease_timeout": self.clients.silence_s}

    def lease_status(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        self.clients.peer(e[0], self._source)
        leases = self.handles.leases
        return {
            "leases": leases.held_by(e[0]),
            "total": len(leases),
            "clients": len(self.clients),
            "registrations": len(self.registrations),
            "lease_timeout": self.clients.silence_s,
            "output_held": self.handles.shares.held_by(e[0]),
            "output_share": self.handles.shares.share,
        }

    # ------------------------------------------------------------------ clients coming and going
    def _track(self, client: bytes) -> Peer:
        """Watch ``client`` (it is about to hold something); who it is."""
        self.clients.track(client, self._source)
        return self.clients.peer(client, self._source)

    def _disconnected(self, client: bytes) -> None:
        self._gone(client)  # its requests are cancelled (a silent one's are not)
        self.lanes.client_gone(client, "disconnected")
        leases = self.handles.reclaim(client)
        regions = self.registrations.drop_owner(client)
        if leases or regions:
            log.info(
                "client %s disconnected: reclaimed %d lease(s), ended %d region registration(s)",
                client.hex(),
                leases,
                regions,
            )

    def _silent(self, client: bytes) -> None:
        self.lanes.client_gone(client, f"was silent for more than {self.clients.silence_s:g}s")
        leases = self.handles.reclaim(client)
        if leases:
            log.warning(
                "client %s was silent for more than %gs: reclaimed its %d lease(s)",
                client.hex(),
                self.clients.silence_s,
                leases,
            )

    def reclaim_tagged(self, tag: bytes) -> None:
        """Reclaim the leases of every client of the socket tagged ``tag`` (its process
        ended); what they registered stays theirs."""
        for owner in self.handles.leases.owners():
            if owner.startswith(tag):
                self.handles.reclaim(owner)

    def tick(self, now: float) -> None:
        self.clients.tick(now)
        self.registrations.tick()

    def close(self) -> None:
        """Stop watching the socket (before its context ends) and end every registration."""
        self.clients.close()
        self.registrations.close()


def _whose(peer: Peer) -> str:
    return "process" if peer.transport == "ipc" else "host"


def _text(h: dict[str, Any], key: str) -> str:
    value = h.get(key)
    if not isinstance(value, str) or not value:
        raise invalid_arg(f"'{h.get('type')}' needs '{key}': a non-empty string, got {value!r}")
    return value


def _opt_text(h: dict[str, Any], key: str) -> str:
    value = h.get(key, "")
    if not isinstance(value, str):
        raise invalid_arg(f"'{h.get('type')}': '{key}' must be a string, got {value!r}")
    return value


def _count(h: dict[str, Any], key: str, default: int | None = None) -> int:
    value = h.get(key, default)
    if type(value) is not int or value < 0:
        raise invalid_arg(f"'{h.get('type')}' needs '{key}': a non-negative integer, got {value!r}")
    return value
