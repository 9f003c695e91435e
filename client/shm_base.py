"""What ShmClient and AsyncShmClient share apart from how they wait: their options, their
session (client.shm_core) and making requests, which never waits."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import zmq

from inferpool.client.connection import Connection
from inferpool.client.core import DEFAULT_TIMEOUT, ClientCore
from inferpool.client.shm_core import ShmSession
from inferpool.client.shm_request import ShmRequest

DEFAULT_INPUT_BYTES = 64 << 20


class ShmBase(Connection):
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
    ) -> None:
        """``input_bytes``: size of the input region the server creates for this client
        (0: none, for callers that only read outputs as handles); ``keepalive``: keep the
        leases of a quiet client (on by default); the rest as for Client."""
        self.routing_id = b"shm." + secrets.token_bytes(12)  # names it in keep-alives
        self._input_bytes = input_bytes
        self._keepalive = keepalive
        super().__init__(
            endpoint,
            timeout=timeout,
            context=context,
            routing_id=self.routing_id,
            curve_server_key=curve_server_key,
            curve_secret_key=curve_secret_key,
        )

    def _new_core(self, endpoint: str, timeout: float) -> ClientCore:
        self.session = ShmSession(endpoint, timeout)
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
