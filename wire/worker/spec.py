"""What the broker tells a worker when it spawns it, and the exit codes the worker answers with.

The spec travels as JSON in one environment variable (:data:`SPEC_ENV`).  The broker builds
it with :func:`spec_environment` and the worker reads it with :func:`read_spec`: nothing
else writes or parses it.  Exit codes are a protocol, as in gunicorn's arbiter: a worker
that fails to boot says why over its channel and exits with :data:`EXIT_BOOT_FAILED`, and
the broker does not respawn it.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from inferpool.wire.errors import Code, InferpoolError

SPEC_ENV = "INFERPOOL_WORKER_SPEC"
# The backend setting that says whether a backend may complete its model's config ("true" or
# "false"), as Triton's core hands it to every backend.
AUTO_COMPLETE_CONFIG = "auto-complete-config"

EXIT_OK = 0
EXIT_BOOT_FAILED = 3  # the model cannot load (reason sent as Failed): do not respawn
EXIT_BROKER_GONE = 4  # the parent died before the worker could tie its life to it
# not a worker's own: the broker's word for a forked worker whose zygote died before it could
# report how the worker ended (broker/pool/zygotes.py)
EXIT_ZYGOTE_GONE = 5
EXIT_NAMES = {
    EXIT_BOOT_FAILED: "boot failed",
    EXIT_BROKER_GONE: "broker gone",
    EXIT_ZYGOTE_GONE: "ended with its zygote",
}
BOOT_EXITS = frozenset({EXIT_BOOT_FAILED, EXIT_BROKER_GONE})  # a worker's words only while it boots


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """The model instance a worker hosts (Triton's instance name, kind and device)."""

    name: str
    kind: str = "CPU"  # CPU, GPU or MODEL
    device_id: int = 0
    index: int = 0  # within the model, over all instance groups
    host_policy: str = ""
    passive: bool = False  # loaded but never scheduled (Triton's passive instances)
    secondary_devices: list[dict[str, Any]] = field(default_factory=list)
    # device_id's CUDA ordinal in the worker, which sees only its CUDA_VISIBLE_DEVICES (the
    # worker sets it after pinning); None: device_id itself
    cuda_ordinal: int | None = None


@dataclass(frozen=True, slots=True)
class PinningSpec:
    """Where the worker pins itself before any heavy import (workers/pinning.py)."""

    cpus: list[int] = field(default_factory=list)  # empty: leave affinity alone
    numa_node: int | None = None
    mempolicy: str = ""  # "", "bind", "preferred", "interleave"
    cuda_visible_devices: str | None = None
    threads: int = 0  # torch intra-op threads; 0 = leave to the backend/torch


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker is started with: its run, channel, model, instance and pinning."""

    run_id: str  # the broker run: every region of it is named inferpool-<run_id>-...
    broker_pid: int  # the worker exits at once if its parent is not this process (the
    # broker's pid; a zygote sets its own in the workers it forks)
    channel_fd: int  # this worker's end of its SOCK_SEQPACKET socketpair with the broker
    identity: str  # "w<slot>.<generation>", for logs
    model_name: str
    model_version: int
    backend: str
    config_json: str  # the ModelConfig in protobuf JSON form, as the repository has it
    repository_path: str  # <repo>/<model>
    artifact_path: str  # <repo>/<model>/<version>
    output_region: str  # this worker's output arena region
    output_prefault: int  # how much of it to populate as the worker boots (shm.warm)
    instance: InstanceSpec
    cancel_region: str = ""  # the run's cancellation marks (shm.cancel_flags); "": none
    pinning: PinningSpec = field(default_factory=PinningSpec)
    backend_directory: str = ""
    backend_config: dict[str, str] = field(default_factory=dict)  # this backend's settings
    gpu_load_limit: float = 1.0  # --model-load-gpu-limit for this GPU instance's device
    log: dict[str, Any] = field(default_factory=dict)  # wire.logs.LogSettings's fields


def spec_environment(spec: WorkerSpec) -> dict[str, str]:
    """The environment variables that hand ``spec`` to a worker process."""
    return {SPEC_ENV: orjson.dumps(spec).decode()}


def read_spec(environ: Mapping[str, str]) -> WorkerSpec:
    """The spec a worker was started with; INTERNAL naming the problem if it is unreadable."""
    text = environ.get(SPEC_ENV)
    if text is None:
        raise InferpoolError(
            Code.INTERNAL,
            f"${SPEC_ENV} is not set: workers are started by the broker (inferpool serve)",
        )
    try:
        raw = orjson.loads(text)
        instance = InstanceSpec(**raw.pop("instance"))
        pinning = PinningSpec(**raw.pop("pinning", {}))
        return WorkerSpec(**raw, instance=instance, pinning=pinning)
    except (orjson.JSONDecodeError, TypeError, KeyError, AttributeError) as exc:
        raise InferpoolError(Code.INTERNAL, f"unreadable ${SPEC_ENV}: {exc}") from None


def describe_exit(code: int, ready: bool = False) -> str:
    """How a worker ended, for logs and errors: a signal name or an exit code's meaning.
    Once the worker was ``ready`` its boot codes are no longer its words: an exit code 3
    then comes from the model's own code (``sys.exit(3)``), not from a failed boot."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    name = None if ready and code in BOOT_EXITS else EXIT_NAMES.get(code)
    return f"exit code {code} ({name})" if name else f"exit code {code}"
