"""The backend API: Triton's TRITONBACKEND_* lifecycle as Python classes.

A backend is a module (or package) that defines ``BACKEND``, a subclass of :class:`Backend`
whose ``model_class`` and ``instance_class`` name its :class:`Model` and
:class:`ModelInstance` subclasses.  The worker process creates one object per level and
calls, in order::

    Backend.initialize()          TRITONBACKEND_Initialize          (once per worker)
    Model.initialize()            TRITONBACKEND_ModelInitialize     (config validation here)
    ModelInstance.initialize()    TRITONBACKEND_ModelInstanceInitialize
    ModelInstance.execute(reqs)   TRITONBACKEND_ModelInstanceExecute (many times)
    ModelInstance.finalize()      TRITONBACKEND_ModelInstanceFinalize
    Model.finalize()              TRITONBACKEND_ModelFinalize
    Backend.finalize()            TRITONBACKEND_Finalize

Finalizers run in reverse, only for the levels whose initialize succeeded.  Context
(names, config, device, logger) is set as attributes before ``initialize`` is called.

Requests and responses live in ``backends.request_io``, statistics and metrics in
``backends.metrics``, shared regions in ``backends.shared_regions``, calls to other models in
``backends.model_calls``; everything a backend author needs is importable from here.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from google.protobuf import json_format

from inferpool.backends.metrics import (
    Metric,
    MetricFamily,
    MetricSink,
    StatisticsReporter,
    Timestamps,
)
from inferpool.backends.model_calls import (
    CallInput,
    CallReply,
    CallRequest,
    InferenceCalls,
    PendingCall,
)
from inferpool.backends.request_io import (
    FLAG_SEQUENCE_END,
    FLAG_SEQUENCE_START,
    InputTensor,
    OutputMemory,
    OutputTensor,
    ParameterValue,
    Request,
    RequestedOutput,
    Response,
    ResponseSender,
    copy_into,
    now_ns,
)
from inferpool.backends.shared_regions import SharedRegion, SharedRegions
from inferpool.wire.errors import InferpoolError, internal, invalid_arg
from inferpool.wire.worker.spec import AUTO_COMPLETE_CONFIG

_log = logging.getLogger("inferpool.worker")

__all__ = [
    "FLAG_SEQUENCE_END",
    "FLAG_SEQUENCE_START",
    "Backend",
    "CallInput",
    "CallReply",
    "CallRequest",
    "InferenceCalls",
    "InputTensor",
    "Metric",
    "MetricFamily",
    "MetricSink",
    "Model",
    "ModelInstance",
    "OutputMemory",
    "OutputTensor",
    "ParameterValue",
    "PendingCall",
    "Request",
    "RequestedOutput",
    "Response",
    "ResponseSender",
    "SharedRegion",
    "SharedRegions",
    "StatisticsReporter",
    "Timestamps",
    "batch_size_of",
    "checked_batch_size",
    "copy_into",
    "iter_responses",
    "now_ns",
]


class _Level:
    """Shared shape of the three levels: optional initialize/finalize and a logger."""

    log: logging.Logger

    def initialize(self) -> None:
        """Called once after the context attributes are set; raise to fail the load."""

    def finalize(self) -> None:
        """Called once, in reverse order, if and only if initialize() succeeded."""


class Backend(_Level):
    """TRITONBACKEND_Backend: state shared by every model of this backend in the worker."""

    model_class: ClassVar[type[Model]]
    instance_class: ClassVar[type[ModelInstance]]
    #: TRITONBACKEND_BackendAttributeSetParallelModelInstanceLoading
    parallel_instance_loading: ClassVar[bool] = False
    #: API version this backend was written for (major must match, minor <= ours).
    api_version: ClassVar[tuple[int, int]] = (1, 0)

    name: str
    #: --backend-config=<backend>,key=value settings
    config: dict[str, str]
    #: --backend-directory ("" where none is searched)
    backend_directory: str = ""
    #: where the metric families it makes are kept (the model's ``stats`` too): Triton's
    #: metric families are the server's, and a C backend may make one before any model
    stats: StatisticsReporter


class Model(_Level):
    """TRITONBACKEND_Model: one model version; validate ``config`` in initialize()."""

    name: str
    version: int
    #: the parsed config.pbtxt (tritonclient model_config_pb2.ModelConfig)
    config: Any
    #: the same config as a plain dict (protobuf field names)
    config_dict: dict[str, Any]
    #: <repo>/<model> and <repo>/<model>/<version>
    repository_path: str
    artifact_path: str
    backend: Backend
    stats: StatisticsReporter
    #: the broker's shared regions (backends.shared_regions), None where no broker serves the model
    shared_regions: SharedRegions | None
    #: inference calls to other served models (backends.model_calls: BLS), None without a broker
    calls: InferenceCalls | None

    @property
    def max_batch_size(self) -> int:
        return int(self.config.max_batch_size)

    @property
    def decoupled(self) -> bool:
        return bool(self.config.model_transaction_policy.decoupled)

    @property
    def auto_complete_config(self) -> bool:
        """TRITONBACKEND_ModelAutoCompleteConfig: whether this backend may complete the
        config (False when the server runs with ``--disable-auto-complete-config``)."""
        return self.backend.config.get(AUTO_COMPLETE_CONFIG, "true") != "false"

    def parameter(self, key: str, default: str | None = None) -> str | None:
        """A ``parameters { key: ... value: { string_value: ... } }`` entry of the config."""
        if key in self.config.parameters:
            return str(self.config.parameters[key].string_value)
        return default

    def metric_family(self, name: str, description: str, kind: str = "counter") -> MetricFamily:
        return self.stats.metric_family(name, description, kind)

    def set_config(self, config: Any) -> None:
        """TRITONBACKEND_ModelSetConfig: replace the config from initialize() (auto-complete).

        The host takes ``config`` as the model's final config once initialize() returns, so
        what a backend completes (inputs, batching, decoupled policy) is what gets served.
        """
        if config.name and config.name != self.name:
            raise invalid_arg(
                f"model '{self.name}': a completed config cannot rename it to '{config.name}'"
            )
        self.config = config
        self.config_dict = json_format.MessageToDict(config, preserving_proto_field_name=True)


class ModelInstance(_Level):
    """TRITONBACKEND_ModelInstance: runs batches; one per worker process."""

    name: str
    #: "CPU", "GPU" or "MODEL"
    kind: str
    #: Triton's device id: for names, statistics and metrics
    device_id: int
    #: the CUDA ordinal of ``device_id`` in this worker process, for ``torch.device`` and
    #: ``cupy.cuda.Device``: a KIND_GPU instance's worker sees only its own GPU
    #: (``CUDA_VISIBLE_DEVICES``), as ordinal 0
    cuda_ordinal: int
    #: index of this instance within the model (0..count-1 over all instance groups)
    index: int
    host_policy: str
    secondary_devices: list[dict[str, Any]]
    model: Model

    def execute(self, requests: list[Request]) -> list[Response] | None:
        """Answer every request exactly once.

        Return one Response per request (in order), or answer through
        ``request.response_sender()`` and return None.  An exception here fails the whole
        batch with its message; a per-request problem should be a ``Response.from_error``.
        """
        raise NotImplementedError

    def report_statistics(
        self,
        request: Request,
        success: bool,
        exec_start: int,
        compute_start: int,
        compute_end: int,
        exec_end: int,
    ) -> None:
        """TRITONBACKEND_ModelInstanceReportStatistics (monotonic ns timestamps)."""
        stamps = tuple.__new__(Timestamps, (exec_start, compute_start, compute_end, exec_end))
        self.model.stats.report_request(request, success, stamps)

    def report_batch_statistics(
        self,
        batch_size: int,
        exec_start: int,
        compute_start: int,
        compute_end: int,
        exec_end: int,
    ) -> None:
        """TRITONBACKEND_ModelInstanceReportBatchStatistics."""
        stamps = tuple.__new__(Timestamps, (exec_start, compute_start, compute_end, exec_end))
        self.model.stats.report_batch(batch_size, stamps)

    def report_memory_usage(
        self, memory_type: str, byte_size: int, device_id: int | None = None
    ) -> None:
        """TRITONBACKEND_ModelInstanceReportMemoryUsage: this instance holds ``byte_size``
        bytes of ``memory_type`` ("CPU", "CPU_PINNED", "GPU") on ``device_id`` (by default its
        own GPU, 0 for host memory).  Reported in initialize(), it appears in the model's
        statistics (``memory_usage``), summed over the model's instances."""
        if device_id is None:
            device_id = self.device_id if memory_type == "GPU" else 0
        self.model.stats.report_memory_usage(memory_type, device_id, byte_size)


def batch_size_of(request: Request, supports_batching: bool) -> int:
    """Batch size a request contributes: its first dimension when the model batches, else 1."""
    if not supports_batching or not request.inputs:
        return 1
    first = next(iter(request.inputs.values()))
    return first.shape[0] if first.shape else 1


def checked_batch_size(first: InputTensor, max_batch_size: int, model: str) -> int:
    """The rows of a request to a batching model, read from its first input ``first``;
    INVALID_ARG when it has no batch dimension or more rows than ``max_batch_size``."""
    if not first.shape:
        raise invalid_arg(
            f"input '{first.name}' of model '{model}' needs a batch dimension "
            f"(max_batch_size {max_batch_size}), got shape []"
        )
    rows = first.shape[0]
    if rows > max_batch_size:
        raise invalid_arg(
            f"inference request batch-size must be <= {max_batch_size} for '{model}', got {rows}"
        )
    return rows


def iter_responses(requests: Sequence[Request], result: Any) -> Iterator[tuple[Request, Any]]:
    """Pair execute()'s returned list with its requests, checking the count."""
    if len(result) != len(requests):
        raise internal(f"execute() returned {len(result)} responses for {len(requests)} requests")
    return zip(requests, result)  # noqa: B905 (counted above; strict= is parsed per call)


def answer_returned(request: Request, response: Any, backend: str) -> None:
    """Answer ``request`` with what execute() returned for it: a Response, or an exception
    (sent as its error); anything else, or a response for a request answered already
    (through its response sender), is the backend's mistake, logged or sent as one."""
    if type(response) is Response and not request.answered:  # the common case
        request.respond(response)
    elif request.answered:
        if isinstance(response, Response):
            response.discard()
        _log.error("backend '%s' returned a response for an answered request", backend)
    elif isinstance(response, Response):
        request.respond(response)
    elif isinstance(response, BaseException):
        request.fail(InferpoolError.wrap(response))
    else:
        request.fail(
            internal(
                f"backend '{backend}' returned {type(response).__name__} instead of a Response"
            ),
        )
