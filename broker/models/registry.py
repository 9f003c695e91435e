"""Served models: one ModelVersion per loaded version, with its I/O contract and state.

The I/O tables are computed once at load (and once more if the backend completes the config,
see models.completion) so that checking a request is a few dict lookups.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.batch_shapes import BatchShapes
from inferpool.broker.models.config import to_dict, to_json
from inferpool.broker.models.labels import Labels
from inferpool.broker.models.stats import ModelStats
from inferpool.broker.pool.handle import WorkerHandle
from inferpool.wire.contract import TensorSpec, tensor_spec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import WantedOutput

if TYPE_CHECKING:
    from inferpool.broker.models.scheduler import Scheduler


class State(str, enum.Enum):
    """A model version's state, as Triton names it."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


class ModelVersion:
    """One version of one model: config, I/O contract, state, instances, queue, statistics."""

    def __init__(self, name: str, version: int, config: pb.ModelConfig, path: str) -> None:
        self.name = name
        self.version = version
        self.repository_config = config  # what workers start from (config.pbtxt, completed)
        self.completed_by = ""  # the instance whose reported config is served (see completion)
        self.path = path
        self.state = State.LOADING
        self.reason = ""
        self.use_config(config)
        self.stats = ModelStats()
        self.instances: list[WorkerHandle[ModelVersion]] = []
        self.placements: list[Any] = []  # pool.placement.Placement, one per instance
        self.scheduler: Scheduler | None = None
        self.version_str = str(version)
        self.header_template: Any = None  # its last plain response header (front.response_header)
        self.file_labels = Labels()  # its outputs' label files (models.labels)
        self.labels = self.file_labels  # what it serves: an ensemble's inherits its steps'

    def use_config(self, config: pb.ModelConfig) -> None:
        """Serve ``config``: the I/O tables admission checks requests against."""
        self.config = config
        self.max_batch_size = int(config.max_batch_size)
        self.decoupled = bool(config.model_transaction_policy.decoupled)
        # a request's priority level (models.queue_policy): 1..priority_levels, 0 without
        self.priority_levels = int(config.dynamic_batching.priority_levels)
        self.default_priority = (
            int(config.dynamic_batching.default_priority_level) if self.priority_levels else 0
        )
        self.inputs = {t.name: tensor_spec(t, t.optional) for t in config.input}
        self.outputs = {t.name: tensor_spec(t) for t in config.output}
        # a request signature -> what admission found checking it (front.admission_plans)
        self.plans: dict[bytes, Any] = {}
        self.required = frozenset(n for n, t in self.inputs.items() if not t.optional)
        self.batch_shapes = BatchShapes(config)  # which requests may share a batch
        self.all_outputs = tuple(self.outputs)
        # what a request that names no outputs gets (shared, never mutated)
        self.default_outputs: dict[str, dict[str, Any]] = {n: {} for n in self.outputs}
        self.default_work_outputs = [WantedOutput(n) for n in self.outputs]

    @property
    def label(self) -> str:
        return f"'{self.name}' version {self.version}"

    def set_state(self, state: State, reason: str = "") -> None:
        self.state = state
        self.reason = reason

    def metadata(self) -> dict[str, Any]:
        batch = [-1] if self.max_batch_size > 0 else []

        def tensors(specs: dict[str, TensorSpec]) -> list[dict[str, Any]]:
            return [
                {"name": s.name, "datatype": s.datatype, "shape": [*batch, *s.dims]}
                for s in specs.values()
            ]

        return {
            "name": self.name,
            "platform": self.config.platform or self.config.backend,
            "backend": self.config.backend,
            "inputs": tensors(self.inputs),
            "outputs": tensors(self.outputs),
        }

    def config_dict(self) -> dict[str, Any]:
        return to_dict(self.config)

    def worker_config_json(self) -> str:
        """The config workers start from: each completes its own (see completion)."""
        return to_json(self.repository_config)


Instance = WorkerHandle[ModelVersion]  # the pool's handle of one instance slot and its worker


@dataclass
class ModelRecord:
    """Everything known about one model name: its versions and, if unloadable, why."""

    name: str
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    error: InferpoolError | None = None  # the whole model failed before any version existed
    fingerprint: str = ""  # of the model directory when loaded (a reload compares it)
    note: str = ""  # e.g. why a reload failed while this record kept serving

    def ready_versions(self) -> list[ModelVersion]:
        return [v for _, v in sorted(self.versions.items()) if v.state is State.READY]


class Registry:
    """Model name -> record; resolves the (name, version) of a request."""

    def __init__(self) -> None:
        self.records: dict[str, ModelRecord] = {}
        self.unloaded: dict[str, list[int]] = {}  # name -> the versions it had when unloaded

    def forget(self, record: ModelRecord) -> bool:
        """Drop ``record`` if it is the one serving its name (an unload): True if it was."""
        if self.records.get(record.name) is not record:
            return False
        del self.records[record.name]
        self.unloaded[record.name] = sorted(record.versions)
        return True

    def resolve(self, name: Any, version: Any) -> ModelVersion:
        """The ModelVersion a request names, or the error Triton gives."""
        if not isinstance(name, str) or not name:
            raise InferpoolError(Code.INVALID_ARG, "request has no model_name")
        record = self.records.get(name)
        if record is None:
            raise InferpoolError(
                Code.NOT_FOUND, f"Request for unknown model: '{name}' is not found"
            )
        if version is not None and (type(version) not in (str, int)):
            raise InferpoolError(
                Code.INVALID_ARG, f"model_version must be a version number, got {version!r}"
            )
        if not version or version in (-1, "-1"):
            best: ModelVersion | None = None
            for mv in record.versions.values():
                if mv.state is State.READY and (best is None or mv.version > best.version):
                    best = mv
            if best is None:
                raise InferpoolError(Code.UNAVAILABLE, _unready(record))
            return best
        try:
            number = int(version)
        except (TypeError, ValueError):
            raise InferpoolError(
                Code.INVALID_ARG, f"model_version must be a version number, got {version!r}"
            ) from None
        found = record.versions.get(number)
        if found is None:
            raise InferpoolError(
                Code.NOT_FOUND,
                f"Request for unknown model: '{name}' version {number} is not found",
            )
        if found.state is not State.READY:
            detail = f": {found.reason}" if found.reason else ""
            raise InferpoolError(
                Code.UNAVAILABLE,
                f"Request for unknown model: '{name}' version {number} is not at ready state"
                f" ({found.state.value}{detail})",
            )
        return found

    def serving(self, name: str) -> bool:
        """Whether model ``name`` has a version ready (Triton's ModelIsReady, any version)."""
        record = self.records.get(name)
        return record is not None and bool(record.ready_versions())

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for name in sorted(self.records):
            record = self.records[name]
            if record.error is not None and not record.versions:
                if not ready_only:
                    rows.append(
                        {
                            "name": name,
                            "version": "",
                            "state": State.UNAVAILABLE.value,
                            "reason": str(record.error),
                        }
                    )
                continue
            for version, mv in sorted(record.versions.items()):
                if ready_only and mv.state is not State.READY:
                    continue
                rows.append(
                    {
                        "name": name,
                        "version": str(version),
                        "state": mv.state.value,
                        "reason": mv.reason or record.note,
                    }
                )
        return rows

    def all_versions(self) -> list[ModelVersion]:
        return [mv for r in self.records.values() for mv in r.versions.values()]


def _unready(record: ModelRecord) -> str:
    """Why ``record`` has no version to serve: each version's state and reason."""
    if record.error is not None and not record.versions:
        return f"model '{record.name}' failed to load: {record.error}"
    states = [
        f"version {v} is {mv.state.value}" + (f" ({mv.reason})" if mv.reason else "")
        for v, mv in sorted(record.versions.items())
    ]
    return f"model '{record.name}' has no version ready to serve: {'; '.join(states)}"
