"""What the KServe frontends' process is told at start: where to listen, where the broker is.

Light on purpose: the broker builds it without importing aiohttp or grpc (only the frontends'
process does), and it travels to that process as one JSON argument.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferpool.broker.kserve.bodies import BodyLimits

BODY_SLACK = 64 << 20  # JSON text and headers beyond the tensor bytes a request may bring


@dataclass(frozen=True)
class FrontendOptions:
    """Where each listener binds (port 0: not served), the largest tensor bytes a request
    may bring (the broker's own limit), and what the frontends hold for a request while it
    arrives (0: derived from the request limit)."""

    http_address: str = "127.0.0.1"
    http_port: int = 0
    grpc_address: str = "127.0.0.1"
    grpc_port: int = 0
    health_address: str = "127.0.0.1"
    health_port: int = 0
    request_limit: int = 256 << 20
    http_max_input_size: int = 0  # one HTTP body (0: the request limit and BODY_SLACK)
    grpc_max_input_size: int = 0  # one gRPC message (0: as an HTTP body)
    http_header_timeout: float = 60.0  # a request's headers, and an idle keep-alive
    http_body_timeout: float = 60.0  # a body, once its headers are in
    http_body_budget: int = 0  # all bodies being received (0: twice the largest body)
    # gRPC over SSL/TLS (Triton's flags): the server's certificate chain and key (PEM files),
    # and with mutual authentication the root certificates client certificates must chain to
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""

    @property
    def enabled(self) -> bool:
        return bool(self.http_port or self.grpc_port or self.health_port)

    @property
    def max_body(self) -> int:
        return self.http_max_input_size or self.request_limit + BODY_SLACK

    @property
    def max_message(self) -> int:
        """The largest gRPC message (grpc's own limit: RESOURCE_EXHAUSTED beyond it)."""
        return min(self.grpc_max_input_size or self.max_body, (1 << 31) - 1)

    @property
    def grpc_security(self) -> str:
        """What the gRPC listener's log line says of its security."""
        if self.grpc_use_ssl_mutual:
            return " (SSL, clients' certificates required)"
        return " (SSL)" if self.grpc_use_ssl else ""

    def bodies(self) -> BodyLimits:
        """The HTTP frontend's limits on bodies (in the frontends' process)."""
        from inferpool.broker.kserve.bodies import BodyLimits

        budget = self.http_body_budget or 2 * self.max_body
        return BodyLimits(self.max_body, self.http_body_timeout, budget)


@dataclass(frozen=True)
class ProcessConfig:
    """The frontends' process: its listeners, the broker's socket for it (``endpoint``),
    the region the broker made for its requests' inputs (``input_region``), the pipe it says
    ``ready`` (or why not) on (``report_fd``), and how it logs (the broker's settings)."""

    options: FrontendOptions
    endpoint: str
    input_region: str
    report_fd: int
    log: dict[str, Any] = field(default_factory=dict)  # wire.logs.LogSettings' fields

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ProcessConfig:
        raw = json.loads(text)
        return cls(**{**raw, "options": FrontendOptions(**raw["options"])})
