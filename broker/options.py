"""Server options: everything `inferpool serve` can be told, with the defaults it uses."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferpool.wire.paths import DEFAULT_TCP, default_ipc_endpoint, default_run_dir

MiB = 1 << 20


@dataclass
class ServerOptions:
    model_repository: str
    listen: list[str] = field(default_factory=lambda: [default_ipc_endpoint(), DEFAULT_TCP])
    run_dir: str = field(default_factory=default_run_dir)
    # shared memory
    arena_size: int = 256 * MiB
    output_arena_size: int = 256 * MiB
    max_request_bytes: int = 256 * MiB
    prefault: bool = True
    max_client_shm: int = 1024 * MiB  # server-made regions per client
    lease_timeout: float = 60.0  # seconds a client holding leases may stay silent
    # models
    model_control_mode: str = "none"  # "none" or "explicit"
    load_models: list[str] = field(default_factory=list)
    strict_readiness: bool = True
    backend_directory: str = ""
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    # workers
    host_policies: list[str] = field(default_factory=list)
    pin: bool = True
    boot_timeout: float = 120.0
    execute_timeout: float = 0.0  # 0: no limit
    graceful_timeout: float = 30.0
    max_restarts: int = 5  # crashes within restart_window before an instance is FAILED
    restart_window: float = 60.0
    heartbeat_ms: int = 1000  # how often a frozen (stopped) worker is looked for; 0: never
    model_load_gpu_limit: dict[int, float] = field(default_factory=dict)  # device -> fraction
    log_level: str = "INFO"
    metrics_port: int = 0  # 0: no Prometheus endpoint
    metrics_address: str = "127.0.0.1"

    @property
    def request_limit(self) -> int:
        return min(self.max_request_bytes, self.arena_size)
