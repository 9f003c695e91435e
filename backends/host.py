"""The backend host: runs one backend's lifecycle in this process and enforces its contract.

A worker runs one (workers/worker.py), and so does ``backends.testing.BackendHarness``.

Levels initialize in order (backend, model, instance) inside a ``contextlib.ExitStack``, so
finalizers run in reverse for exactly the levels that succeeded.  ``execute`` makes sure
every request is answered exactly once, whatever the backend does.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from inferpool.backends import batch_strategy, threads
from inferpool.backends.api import (
    Backend,
    InferenceCalls,
    Model,
    ModelInstance,
    Request,
    SharedRegions,
    answer_returned,
    iter_responses,
)
from inferpool.backends.loader import find_backend
from inferpool.backends.metrics import RequestTiming, StatsCollector, Timestamps
from inferpool.wire.errors import Code, InferpoolError, internal
from inferpool.wire.worker.protocol import BatchStats
from inferpool.wire.worker.spec import InstanceSpec

API_VERSION = (1, 0)
_make = tuple.__new__  # a NamedTuple without its Python-level __new__
log = logging.getLogger("inferpool.worker")


class BackendHost:
    """One backend, one model, one instance: the levels a worker process hosts."""

    def __init__(
        self,
        *,
        backend_name: str,
        model_name: str,
        model_version: int,
        config_json: str,
        repository_path: str,
        artifact_path: str,
        instance: InstanceSpec,
        backend_directory: str = "",
        backend_config: dict[str, str] | None = None,
        shared_regions: SharedRegions | None = None,
        calls: InferenceCalls | None = None,
    ) -> None:
        self.backend_name = backend_name
        self.model_name = model_name
        self.model_version = model_version
        self.config = json_format.Parse(config_json, model_config_pb2.ModelConfig())
        self.repository_path = repository_path
        self.artifact_path = artifact_path
        self.instance_spec = instance
        self.backend_directory = backend_directory
        self.backend_config = backend_config or {}
        self.stats = StatsCollector()
        self.shared_regions = shared_regions
        self.calls = calls
        self.backend: Backend | None = None
        self.model: Model | None = None
        self.instance: ModelInstance | None = None
        self._stack = contextlib.ExitStack()

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)

    def config_dict(self) -> dict[str, Any]:
        """The served config (after load: as the backend completed it), protobuf JSON."""
        return json_format.MessageToDict(self.config, preserving_proto_field_name=True)

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Initialize the three levels; on failure finalize what did initialize and raise."""
        label = f"model '{self.model_name}' version {self.model_version}"
        try:
            found = find_backend(
                self.backend_name, self.repository_path, self.artifact_path, self.backend_directory
            )
            batch_strategy.check(
                self.config,
                self.backend_name,
                self.artifact_path,
                self.repository_path,
                self.backend_directory,
            )
            cls = found.backend_class
            major, minor = cls.api_version
            if major != API_VERSION[0] or minor > API_VERSION[1]:
                raise InferpoolError(
                    Code.UNSUPPORTED,
                    f"backend '{self.backend_name}' needs API {major}.{minor}; "
                    f"inferpool provides {API_VERSION[0]}.{API_VERSION[1]}",
                )
            backend = cls()
            backend.name = self.backend_name
            backend.config = dict(self.backend_config)
            backend.backend_directory = self.backend_directory
            backend.stats = self.stats
            backend.log = logging.getLogger(f"inferpool.backend.{self.backend_name}")
            self._enter(backend, "TRITONBACKEND_Initialize (Backend.initialize)")
            self.backend = backend

            model = cls.model_class()
            model.name = self.model_name
            model.version = self.model_version
            model.config = self.config
            model.config_dict = json_format.MessageToDict(
                self.config, preserving_proto_field_name=True
            )
            model.repository_path = self.repository_path
            model.artifact_path = self.artifact_path
            model.backend = backend
            model.stats = self.stats
            model.shared_regions = self.shared_regions
            model.calls = self.calls
            model.log = logging.getLogger(f"inferpool.model.{self.model_name}")
            self._enter(model, "TRITONBACKEND_ModelInitialize (Model.initialize)")
            self.model = model
            self.config = model.config  # Model.set_config() may have completed it

            spec = self.instance_spec
            inst = cls.instance_class()
            inst.name = spec.name
            inst.kind = spec.kind
            inst.device_id = spec.device_id
            inst.cuda_ordinal = spec.device_id if spec.cuda_ordinal is None else spec.cuda_ordinal
            inst.index = spec.index
            inst.host_policy = spec.host_policy
            inst.secondary_devices = list(spec.secondary_devices)
            inst.model = model
            inst.log = logging.getLogger(f"inferpool.instance.{inst.name}")
            self._enter(inst, "TRITONBACKEND_ModelInstanceInitialize (ModelInstance.initialize)")
            self.instance = inst
        except InferpoolError as err:
            self.close()
            raise InferpoolError(err.code, f"failed to load {label}: {err.message}") from None

    def _enter(self, level: Any, hook: str) -> None:
        try:
            level.initialize()
        except Exception as exc:
            raise InferpoolError.wrap(exc, Code.INTERNAL, f"{hook} failed: ") from exc
        self._stack.callback(
            self._finalize, level, hook.split(" ")[0].replace("Initialize", "Finalize")
        )

    @staticmethod
    def _finalize(level: Any, hook: str) -> None:
        try:
            level.finalize()
        except Exception:
            log.exception("%s raised; continuing with the remaining finalizers", hook)

    def close(self) -> None:
        """Run the finalizers of every level that initialized, in reverse order."""
        self._stack.close()
        self.instance = self.model = self.backend = None

    # ------------------------------------------------------------------ execution
    def execute(self, requests: list[Request]) -> None:
        """Run one batch; afterwards every request is answered or owned by its sender.

        A raising backend fails the requests it had not answered yet; the worker carries on.
        """
        assert self.instance is not None, "execute before load"
        if not threads.adopted.done:
            threads.adopt_torch_threads()
        try:
            result = self.instance.execute(requests)
            if result is not None:
                for request, response in iter_responses(requests, result):
                    answer_returned(request, response, self.backend_name)
        except Exception as exc:
            err = InferpoolError.wrap(exc, Code.INTERNAL)
            log.error("execute of %s failed: %s", self.model_name, err)
            for request in requests:
                request.fail(err)
            return
        for request in requests:
            if request.answered or (request.sender_taken and request.decoupled):
                continue
            request.fail(
                internal(
                    f"backend '{self.backend_name}' did not send a final response for "
                    f"request '{request.id}' of model '{self.model_name}'"
                ),
            )

    def timing_of(self, request: Request) -> RequestTiming | None:
        return self.stats.timings.pop(id(request), None)

    def take_batches(self) -> list[BatchStats]:
        """The batches reported since the last take, as the broker counts them."""
        taken = []  # a loop, not a comprehension: this runs once per batch
        for size, stamps in self.take_stamps():
            taken.append(_make(BatchStats, (size, stamps.durations())))
        return taken

    def take_stamps(self) -> list[tuple[int, Timestamps]]:
        """The batches reported since the last take, as reported: (batch size, instants)."""
        batches, self.stats.batches = self.stats.batches, []
        return batches
