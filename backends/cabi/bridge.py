"""The bridge: what the C host calls back into, the same Python objects a Python backend
uses (``backends.request_io`` requests and responses, ``backends.metrics`` statistics and
metrics), so that a C backend keeps the same rules.

Each method is called by the host with the GIL held, from the thread the backend called on
(its execute thread or one of its own).  An exception becomes the TRITONSERVER_Error the
API call returns (its code from an InferpoolError, else INTERNAL).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from inferpool.backends.cabi import server_calls
from inferpool.backends.metrics import Metric, MetricFamily, StatisticsReporter
from inferpool.backends.model_calls import InferenceCalls
from inferpool.backends.request_io import ParameterValue, Request, Response
from inferpool.wire import codec
from inferpool.wire.errors import TRITON_CODES, Code, InferpoolError, invalid_arg

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
GPU = 2  # TRITONSERVER_MEMORY_GPU
METRIC_KINDS = ("counter", "gauge")  # by TRITONSERVER_MetricKind
# TRITONSERVER_LogLevel -> logging level
LOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG)


def error_of(code: int, message: str) -> InferpoolError:
    """A TRITONSERVER_Error as inferpool's error."""
    known = 0 <= code < len(TRITON_CODES)
    return InferpoolError(TRITON_CODES[code] if known else Code.UNKNOWN, message)


def placed(buffer: Any) -> Any:
    """A buffer as the host takes it: host memory as it is, device memory as (address,
    GPU, device id)."""
    if type(buffer) is memoryview:
        return buffer
    device = codec.device_of(buffer)
    if device is None:
        return memoryview(buffer).cast("B")
    return int(buffer.__cuda_array_interface__["data"][0]), GPU, int(device)


class _States:
    """The implicit state one request's backend made (TRITONBACKEND_StateNew): allocated
    like outputs, carried to the next request of the sequence once updated."""

    def __init__(self, request: Request) -> None:
        self.holder = Response(request)  # never sent: it only owns the state buffers
        self.updated: set[str] = set()


class Bridge:
    """The Python side of the C host: each backend API call it cannot answer in C ends here."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("inferpool.backend")
        self.stats: StatisticsReporter | None = None  # the backend's, once it initializes
        self.calls: InferenceCalls | None = None  # the model's calls (None: no broker)
        self.deliver: server_calls.Deliver | None = None  # the host's, once bound
        # the server's answers about served models, kept while an execute runs
        self.facts: dict[tuple[str, int], dict[str, Any]] | None = None
        self._states: dict[int, _States] = {}

    # ------------------------------------------------------------------ responses
    def output(
        self,
        request: Request,
        response: Response | None,
        name: str,
        datatype: str,
        shape: tuple[int, ...],
        nbytes: int,
    ) -> tuple[Response, Any]:
        """TRITONBACKEND_OutputBuffer: memory for an output, in the worker's output region
        (or the client's region the output was asked into)."""
        if response is None:
            response = Response(request)
        buffer = response.allocate(name, datatype, shape, nbytes)
        return response, buffer if type(buffer) is memoryview else placed(buffer)

    def send(
        self,
        request: Request,
        response: Response | None,
        parameters: dict[str, ParameterValue] | None,
        flags: int,
        error: tuple[int, str] | None,
        is_response: bool,
    ) -> None:
        """TRITONBACKEND_ResponseSend (``is_response``) and
        TRITONBACKEND_ResponseFactorySendFlags."""
        final = bool(flags & FINAL)
        if error is not None:
            if response is not None:
                response.discard()
            response = Response(request, error_of(*error))
        elif is_response:
            if response is None:
                response = Response(request)
            if parameters:  # made by the host: str, int, bool or float values
                response.parameters.update(parameters)
            if self._states:
                self._carry_states(request, response)
        if final and self._states:
            self._drop_states(request)
        if final and response is not None and not request.decoupled and not request.sender_taken:
            request.respond(response)
        else:
            request.response_sender().send(response, final)

    def cancelled(self, request: Request) -> bool:
        return request.is_cancelled()

    # ------------------------------------------------------------------ implicit state
    def state_buffer(
        self, request: Request, name: bytes, datatype: str, shape: tuple[int, ...], nbytes: int
    ) -> Any:
        states = self._states.get(id(request))
        if states is None:
            states = self._states[id(request)] = _States(request)
        return placed(states.holder.allocate(name.decode(), datatype, shape, nbytes))

    def state_update(self, request: Request, name: bytes) -> None:
        states = self._states.get(id(request))
        text = name.decode()
        if states is None or text not in states.holder.outputs:
            raise invalid_arg(f"state '{text}' has no buffer: call TRITONBACKEND_StateBuffer first")
        states.updated.add(text)

    def _carry_states(self, request: Request, response: Response) -> None:
        """The states the backend updated leave with the request's next response."""
        states = self._states.get(id(request))
        if states is not None:
            for name in states.updated:
                response.outputs[name] = states.holder.outputs.pop(name)
            states.updated.clear()

    def forget_states(self, requests: list[Request]) -> None:
        """Give back the state buffers of requests that will not answer through the host
        (a failed execute: their state is not carried)."""
        if self._states:
            for request in requests:
                self._drop_states(request)

    def _drop_states(self, request: Request) -> None:
        states = self._states.pop(id(request), None)
        if states is not None:
            states.holder.discard()

    # ------------------------------------------------------------------ statistics
    def statistics(
        self, instance: Any, request: Request, success: int, t0: int, t1: int, t2: int, t3: int
    ) -> None:
        instance.report_statistics(request, bool(success), t0, t1, t2, t3)

    def batch(self, instance: Any, size: int, t0: int, t1: int, t2: int, t3: int) -> None:
        instance.report_batch_statistics(size, t0, t1, t2, t3)

    def response_statistics(
        self, instance: Any, request: Request, start: int, output_start: int, end: int, ok: int
    ) -> None:
        """TRITONBACKEND_ModelInstanceReportResponseStatistics: the worker times each
        response of a decoupled model itself, as it sends it; the backend's report is
        accepted and not counted twice."""

    def memory(self, owner: Any, usage: list[tuple[str, int, int]]) -> None:
        for memory_type, device_id, byte_size in usage:
            owner.report_memory(memory_type, device_id, byte_size)

    # ------------------------------------------------------------------ metrics
    def metric_family(self, kind: int, name: str, description: str) -> MetricFamily:
        if self.stats is None:
            raise InferpoolError(Code.UNAVAILABLE, f"metric family '{name}': no backend is loaded")
        return self.stats.metric_family(name, description, METRIC_KINDS[kind])

    def metric(self, family: MetricFamily, labels: dict[str, str]) -> Metric:
        return family.metric(**labels)

    def metric_op(self, metric: Metric, op: str, value: float) -> None:
        if op == "inc":
            metric.increment(value)
        else:
            metric.set(value)

    # ------------------------------------------------------------------ the server's API
    def infer(self, capsule: Any, *request: Any) -> server_calls.CCall:
        """TRITONSERVER_ServerInferAsync (server_calls.infer)."""
        assert self.deliver is not None
        return server_calls.infer(self.calls, self.deliver, capsule, *request)

    def query(self, model_name: str, model_version: int) -> dict[str, Any]:
        """TRITONSERVER_ServerModel* and TRITONSERVER_InferenceRequestNew.  While an execute
        runs, what the broker said of a served model is kept: a backend that checks a model
        (ready, decoupled, its config) before each request it makes asks once per execute;
        a model that is not served is asked about again."""
        facts = self.facts
        key = (model_name, model_version)
        if facts is not None and key in facts:
            return facts[key]
        answer = server_calls.query(self.calls, model_name, model_version)
        if facts is not None:
            facts[key] = answer
        return answer

    def labels(self, model_name: str, model_version: int) -> dict[str, list[str]]:
        """TRITONSERVER_InferenceResponseOutputClassificationLabel: the labels of a served
        version's outputs (label_filename, read by the broker at load), asked once per
        response that wants them."""
        answer = server_calls.query(self.calls, model_name, model_version, labels=True)
        return dict(answer["labels"])

    # ------------------------------------------------------------------ model and logs
    def set_config(self, model: Any, json_text: str) -> str:
        return str(model.complete_config(json_text))

    def log(self, level: int, filename: str, line: int, message: str) -> None:
        py_level = LOG_LEVELS[level] if 0 <= level < len(LOG_LEVELS) else logging.INFO
        logger = self.logger
        if logger.isEnabledFor(py_level):  # JSON lines carry the file and line as "source"
            source = f"{os.path.basename(filename)}:{line}"
            logger.handle(
                logger.makeRecord(
                    logger.name,
                    py_level,
                    filename,
                    line,
                    message,
                    (),
                    None,
                    extra={"source": source},
                )
            )
