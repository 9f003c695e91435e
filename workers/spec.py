"""What the broker tells a worker at spawn time (JSON in INFERPOOL_WORKER_SPEC).

The broker builds this as a plain dict (it talks to workers only through messages); this
dataclass is the authority on its keys.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

ENV_VAR = "INFERPOOL_WORKER_SPEC"

# Exit codes are a protocol between worker and supervisor (as gunicorn's arbiter).
EXIT_OK = 0
EXIT_BOOT_FAILED = 3  # the model cannot load: do not respawn, mark the instance FAILED
EXIT_BROKER_GONE = 4  # the parent died or vanished: nothing to report to


@dataclass
class InstanceSpec:
    name: str
    kind: str = "CPU"  # CPU, GPU or MODEL
    device_id: int = 0
    index: int = 0
    host_policy: str = ""
    passive: bool = False  # loaded but never scheduled (Triton's passive instances)
    secondary_devices: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PinningSpec:
    cpus: list[int] = field(default_factory=list)  # empty: leave affinity alone
    numa_node: int | None = None
    mempolicy: str = ""  # "", "bind", "preferred", "interleave"
    cuda_visible_devices: str | None = None
    threads: int = 0  # torch intra-op threads; 0 = leave to the backend/torch


@dataclass
class WorkerSpec:
    run_id: str  # the broker run: every region of it is named inferpool-<run_id>-...
    channel_fd: int  # this worker's end of its SOCK_SEQPACKET socketpair with the broker
    identity: str  # "w<slot>.<generation>", for logs
    model_name: str
    model_version: int
    backend: str
    config_json: str  # the ModelConfig in protobuf JSON form
    repository_path: str  # <repo>/<model>
    artifact_path: str  # <repo>/<model>/<version>
    output_region: str  # this worker's output arena region
    instance: InstanceSpec
    pinning: PinningSpec = field(default_factory=PinningSpec)
    backend_directory: str = ""
    backend_config: dict[str, str] = field(default_factory=dict)  # this backend's settings
    gpu_load_limit: float = 1.0  # --model-load-gpu-limit for this GPU instance's device
    log_level: str = "INFO"

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WorkerSpec:
        d = dict(d)
        d["instance"] = InstanceSpec(**d["instance"])
        d["pinning"] = PinningSpec(**d.get("pinning", {}))
        return cls(**d)

    @classmethod
    def from_env(cls) -> WorkerSpec:
        return cls.from_dict(json.loads(os.environ[ENV_VAR]))
