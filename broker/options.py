"""Server options: everything `inferpool serve` can be told, with the defaults it uses.

Frozen: the broker reads them once while it builds its components, and each component gets
only what it uses (a plain value, or the slice it declares, such as the supervisor's
``SupervisorOptions``), so no component can see, or change, another's settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from inferpool.broker.curve_auth import CurveKeys, load_server_keys
from inferpool.broker.models.trace_settings import TraceSetting
from inferpool.broker.pool.supervisor import SupervisorOptions
from inferpool.wire.errors import invalid_arg
from inferpool.wire.logs import LogSettings
from inferpool.wire.paths import DEFAULT_TCP, default_ipc_endpoint, default_run_dir

if TYPE_CHECKING:  # the frontends (grpc, aiohttp) are imported by the broker that serves them,
    from inferpool.broker.kserve.frontend_options import FrontendOptions  # not by every CLI command

MiB = 1 << 20


def default_listen() -> tuple[str, ...]:
    """The current user's ipc endpoint and the local tcp one."""
    return (default_ipc_endpoint(), DEFAULT_TCP)


@dataclass(frozen=True)
class ServerOptions:
    """What ``inferpool serve`` was told; every part gets the fields it uses."""

    model_repository: str
    listen: tuple[str, ...] = field(default_factory=default_listen)
    run_dir: str = field(default_factory=default_run_dir)
    # who may connect: the ipc socket's directory ("user": 0700, "group": 0750), CURVE on tcp
    ipc_access: str = "user"
    curve_secret_key: str = ""  # the server's certificate (with its secret key)
    curve_authorized_keys: str = ""  # a directory of the clients' public certificates
    # shared memory
    arena_size: int = 256 * MiB
    output_arena_size: int = 256 * MiB
    max_request_bytes: int = 256 * MiB
    prefault: int = 4 * MiB  # of the arena and of each output region, populated at start
    max_client_shm: int = 1024 * MiB  # server-made regions per client process (tcp: host)
    max_shm_total: int = 4096 * MiB  # server-made regions of all clients together
    client_output_share: int = 0  # output bytes one client may hold; 0: half an output arena
    lease_timeout: float = 60.0  # seconds a client holding leases may stay silent
    lane_spin_us: int = 100  # how long a worker spins for a lane's next request; 0: never
    # models
    model_control_mode: str = "none"  # "none", "explicit" or "poll"
    load_models: tuple[str, ...] = ()
    strict_readiness: bool = True
    auto_complete_config: bool = True  # False: --disable-auto-complete-config
    exit_on_error: bool = True  # a model that fails to load at start stops the start
    backend_directory: str = ""
    backend_config: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    repository_poll_secs: float = 15.0  # poll mode: how often the repository is compared
    cache_size: int = 0  # the response cache's bytes (0: no cache)
    rate_limit: str = "off"  # "execution_count": instances run only with their resources
    rate_limit_resources: tuple[str, ...] = ()  # NAME:COUNT[:DEVICE] (Triton's syntax)
    # workers
    host_policies: tuple[str, ...] = ()
    pin: bool = True
    sched_slice_us: int = 300  # the scheduler slice asked for (broker/sched_slice.py); 0: none
    boot_timeout: float = 120.0
    execute_timeout: float = 0.0  # 0: no limit
    graceful_timeout: float = 30.0  # a stopping worker's time for its finalizers
    # a drain (SIGTERM, the drain message): admissions stop drain_delay seconds after it
    # began, then the admitted requests get drain_timeout (None: graceful_timeout)
    drain_delay: float = 0.0
    drain_timeout: float | None = None
    max_restarts: int = 5  # crashes within restart_window before an instance is FAILED
    restart_window: float = 60.0
    worker_start: str = "zygote"  # or "fresh" (broker/pool/zygotes.py)
    heartbeat_ms: int = 1000  # how often a frozen (stopped) worker is looked for; 0: never
    model_load_gpu_limit: Mapping[int, float] = field(default_factory=dict)  # device -> fraction
    log: LogSettings = field(default_factory=LogSettings)  # what is logged, and how
    server_id: str = "triton"  # the server's name in server metadata (Triton's --id)
    trace: TraceSetting = field(default_factory=TraceSetting)  # --trace-config: the start's
    metrics_port: int = 0  # 0: no Prometheus endpoint
    metrics_address: str = "127.0.0.1"
    # the KServe frontends (0: off; `inferpool serve` defaults to Triton's 8000 and 8001)
    http_port: int = 0
    http_address: str = "127.0.0.1"
    grpc_port: int = 0
    grpc_address: str = "127.0.0.1"
    health_port: int = 0  # the health routes alone
    health_address: str = "127.0.0.1"
    # what the frontends hold for a request while it arrives (0: from max_request_bytes)
    http_max_input_size: int = 0
    grpc_max_input_size: int = 0
    http_header_timeout: float = 60.0
    http_body_timeout: float = 60.0
    http_body_budget: int = 0
    grpc_use_ssl: bool = False  # gRPC over SSL/TLS, with Triton's flags
    grpc_use_ssl_mutual: bool = False  # clients must present a certificate of grpc_root_cert
    grpc_server_cert: str = ""  # PEM files
    grpc_server_key: str = ""
    grpc_root_cert: str = ""

    @property
    def explicit(self) -> bool:
        """Models load and unload only when asked (``--model-control-mode explicit``)."""
        return self.model_control_mode == "explicit"

    @property
    def polling(self) -> bool:
        """Changes in the repository are applied every ``repository_poll_secs``."""
        return self.model_control_mode == "poll"

    @property
    def output_share(self) -> int:
        """The output bytes one client (process, tcp host) may hold before it must read."""
        return self.client_output_share or self.output_arena_size // 2

    @property
    def in_flight_timeout(self) -> float:
        """How long admitted requests may finish once a drain stopped admissions."""
        return self.graceful_timeout if self.drain_timeout is None else self.drain_timeout

    @property
    def request_limit(self) -> int:
        """The most tensor bytes one request may bring: it must fit in the arena."""
        return min(self.max_request_bytes, self.arena_size)

    def frontends(self) -> FrontendOptions:
        """The KServe frontends' slice, with the broker's request limit."""
        from inferpool.broker.kserve.frontend_options import FrontendOptions

        names = (f.name for f in fields(FrontendOptions) if f.name != "request_limit")
        return FrontendOptions(
            request_limit=self.request_limit, **{name: getattr(self, name) for name in names}
        )

    def curve_keys(self) -> CurveKeys | None:
        """The CURVE keys of the tcp endpoints (None: plain tcp); INVALID_ARG if unusable."""
        if not self.curve_secret_key and not self.curve_authorized_keys:
            return None
        if not self.curve_secret_key or not self.curve_authorized_keys:
            raise invalid_arg(
                "CURVE needs both --curve-secret-key (the server's key) and "
                "--curve-authorized-keys (the clients it lets in)"
            )
        return load_server_keys(self.curve_secret_key, self.curve_authorized_keys)

    def supervisor(self) -> SupervisorOptions:
        """The supervisor's slice (its fields are named as here)."""
        names = (f.name for f in fields(SupervisorOptions))
        return SupervisorOptions(**{name: getattr(self, name) for name in names})
