"""What ShmClient and AsyncShmClient share apart from how they wait: their options, their
session (client.shm_core) and making requests, which never waits."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import zmq

from inferpool.client.connection import Connection
from inferpool.client.core import DEFAULT_TIMEOUT, ClientCore
from inferpool.client.lane_book import Pin, pin_option
from inferpool.client.shm_core import ShmSession
from inferpool.client.shm_request import ShmRequest

DEFAULT_INPUT_BYTES = 64 << 20
DEFAULT_LANE_SPIN_US = 100


class ShmBase(Connection):
    """What both shared-memory clients share: the session and its regions."""

    session: ShmSession

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        input_bytes: int = DEFAULT_INPUT_BYTES,
        keepalive: bool = True,
        context: zmq.Context[Any] | None = None,
        curve_server_key: str | bytes | None = None,
        curve_secret_key: str | None = None,
        lane: bool = False,
        lane_spin_us: int = DEFAULT_LANE_SPIN_US,
        lane_slots: int = 0,
        pin: Pin = None,
    ) -> None:
        """``input_bytes``: size of the input region the server creates for this client
        (0: none, for callers that only read outputs as handles); ``keepalive``: keep the
        leases of a quiet client (on by default); ``lane``: run every request through a
        lane to its model's worker where the server grants one (docs/PROTOCOL.md, lanes);
        ``lane_spin_us``: how long a lane's wait spins before it sleeps, while the waiting
        thread runs on a core the worker may not run on (0: never); ``lane_slots``: requests
        one lane holds in flight (default: 1 for ShmClient, 8 for AsyncShmClient); ``pin``:
        pin the thread that opens a lane (it runs the lane's first request) to a core apart
        from the lane's worker, so that its waits spin: ``"auto"`` (a core no worker holds),
        a core or cores by number, or None (the default: the thread stays where it is, and
        spins whenever the scheduler runs it apart from the worker); the rest as for
        Client."""
        self.routing_id = b"shm." + secrets.token_bytes(12)  # names it in keep-alives
        self._input_bytes = input_bytes
        self._keepalive = keepalive
        slots = lane_slots or self.LANE_SLOTS
        self._lane = (lane, max(0, lane_spin_us), slots, pin_option(pin))
        super().__init__(
            endpoint,
            timeout=timeout,
            context=context,
            routing_id=self.routing_id,
            curve_server_key=curve_server_key,
            curve_secret_key=curve_secret_key,
        )

    LANE_SLOTS = 1

    def _new_core(self, endpoint: str, timeout: float) -> ClientCore:
        self.session = ShmSession(endpoint, timeout, *self._lane)
        return self.session

    def request(
        self,
        model: str,
        outputs: Sequence[str] | None = None,
        *,
        version: str | int = "",
        parameters: dict[str, Any] | None = None,
    ) -> ShmRequest:
        """A reusable request; ``outputs`` default to every output of the model (asked by
        the first ``run`` unless known already).  A plain call for both clients."""
        return self.session.request(model, outputs, version, parameters)
