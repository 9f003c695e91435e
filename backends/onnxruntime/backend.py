"""The ONNX Runtime backend: Triton's onnxruntime backend (``model.onnx``) over inferpool's
worker API.

``OnnxModel`` completes the config from the model file (Triton's auto-complete) and checks
the config against it; ``OnnxInstance`` opens the instance's session on its device and runs
batches: requests of one signature run together, their tensors bound where they lie
(``binding``), each request answered, then the seed's statistics.  Sequence control inputs
and implicit states are model inputs and outputs like any other: the worker adds the
controls and carries each state to the sequence's next request.  Ragged inputs, batch
inputs and batch outputs are Triton's (``backends.batch_io``): a ragged input's requests run
together whatever their shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from inferpool.backends import extras, model_io
from inferpool.backends.api import (
    Backend,
    Metric,
    Model,
    ModelInstance,
    Request,
    Response,
    checked_batch_size,
    now_ns,
)
from inferpool.backends.batch_io import BatchIO
from inferpool.backends.onnxruntime import ort_session
from inferpool.backends.onnxruntime.binding import Binder, OutputSpec
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError, invalid_arg, unavailable

COPIED_METRIC = "inferpool_onnxruntime_copied_bytes"


class OnnxModel(Model):
    """An ONNX model: its config checked and completed from the model file."""

    backend: OnnxBackend

    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_ModelInitialize: %s (version %d)", self.name, self.version)
        ort = self.backend.ort
        self.settings = ort_session.Settings.parse(self)
        # the model's tensors, read from a session that optimizes nothing (quick to open)
        path = ort_session.model_path(
            self.artifact_path, self.config.default_model_filename, self.name
        )
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = 1
        try:
            probe = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise unavailable(f"failed to load model '{self.name}' from '{path}': {exc}") from None
        inputs = ort_session.tensors(probe.get_inputs())
        outputs = ort_session.tensors(probe.get_outputs())
        overridable = ort_session.tensors(probe.get_overridable_initializers())
        del probe
        written = model_io.declared_inputs(self.config) and len(self.config.output)
        if self.auto_complete_config and not written:
            default = model_io.default_max_batch_size(self.backend.config, self.backend.name)
            batching = model_io.can_batch(inputs, outputs)
            self.set_config(
                model_io.autocomplete(
                    self.config, self.name, inputs, outputs, batching, default, self.log
                )
            )
        elif written:
            self.log.info(
                "skipping model configuration auto-complete for '%s': inputs and outputs "
                "already specified",
                self.name,
            )
        model_io.check_inputs(self.config, self.name, inputs, model_io.ONNX_RULES, overridable)
        model_io.check_outputs(self.config, self.name, outputs, model_io.ONNX_RULES)
        self.outputs = _output_specs(self.config, outputs)
        self.batch_io = BatchIO(self.config)
        # ONNX Runtime binds no BYTES (string) tensor: such a model runs through run()
        self.bound = all(t.config_type != "TYPE_STRING" for t in (*inputs, *outputs))


def _output_specs(config: Any, outputs: Sequence[model_io.ModelTensor]) -> dict[str, OutputSpec]:
    """The outputs a request may get (the config's and the states'), with the model's
    shapes, in the model's order."""
    names = {o.name for o in config.output}
    names.update(s.output_name for s in config.sequence_batching.state)
    return {
        t.name: OutputSpec(t.name, codec.config_to_wire_datatype(t.config_type), t.shape)
        for t in outputs
        if t.name in names
    }


class OnnxInstance(ModelInstance):
    """One ONNX Runtime session that reads inputs in place and writes outputs into the responses."""

    model: OnnxModel

    def initialize(self) -> None:
        model = self.model
        self.log.info(
            "TRITONBACKEND_ModelInstanceInitialize: %s (%s device %d)",
            self.name,
            self.kind,
            self.device_id,
        )
        ort = model.backend.ort
        path = ort_session.model_path(
            model.artifact_path, model.config.default_model_filename, self.name
        )
        settings = model.settings
        self.session = ort_session.open_session(
            ort, path, settings, self.kind, self.cuda_ordinal, model.name, self.name
        )
        self.log.info(
            "instance '%s' runs on %s", self.name, ", ".join(self.session.get_providers())
        )
        self.max_batch_size = model.max_batch_size
        self.batching = self.max_batch_size > 0
        self.binder = Binder(
            self.session,
            settings.run_options(ort),
            model.outputs,
            self.batching,
            self.kind == "GPU",
            self.cuda_ordinal,
            model.bound,
            model.batch_io,
        )
        self.copied: Metric = model.metric_family(
            COPIED_METRIC,
            "Bytes the onnxruntime backend copied: inputs of a batch joined, outputs it could "
            "not bind in place",
        ).metric(model=model.name, version=str(model.version))
        self._reported_copies = 0

    def finalize(self) -> None:
        self.log.info("TRITONBACKEND_ModelInstanceFinalize: %s", self.name)
        del self.binder, self.session

    # ------------------------------------------------------------------ execution
    def execute(self, requests: list[Request]) -> None:
        """Answer each request, then report the statistics (as identity.cc does)."""
        exec_start = now_ns()
        responses = {id(r): Response(r) for r in requests}
        groups = self._groups(requests, responses)
        spans = []
        for group, rows in groups:
            spans.append((group, rows, self._run(group, rows, responses)))
        for request in requests:
            request.respond(responses[id(request)])
        exec_end = now_ns()
        for group, rows, (compute_start, compute_end) in spans:
            for request in group:
                ok = responses[id(request)].error is None
                self.report_statistics(
                    request, ok, exec_start, compute_start, compute_end, exec_end
                )
            self.report_batch_statistics(rows, exec_start, compute_start, compute_end, exec_end)
        for request in requests:  # those that failed their checks ran in no group
            if all(request not in group for group, _, _ in spans):
                self.report_statistics(request, False, exec_start, exec_start, exec_start, exec_end)
        copied = self.binder.copied - self._reported_copies
        if copied:
            self.copied.increment(copied)
            self._reported_copies = self.binder.copied

    def _groups(
        self, requests: list[Request], responses: dict[int, Response]
    ) -> list[tuple[list[Request], int]]:
        """The requests that pass their checks, in groups of one signature (the same inputs,
        of the same datatypes and shapes past the batch dimension, a ragged input's shape aside),
        with their rows."""
        groups: dict[tuple[Any, ...], tuple[list[Request], list[int]]] = {}
        shape_key = self.model.batch_io.shape_key
        for request in requests:
            try:
                rows = self._rows(request)
            except InferpoolError as err:
                responses[id(request)] = Response(request, err)
                continue
            key: tuple[Any, ...] = tuple(
                (n, t.datatype, shape_key(t, self.batching), t.memory)
                for n, t in request.inputs.items()
            )
            members, counts = groups.setdefault(key, ([], [0]))
            if self.batching and members and counts[0] + rows > self.max_batch_size:
                key = (*key, id(request))  # past max_batch_size: a batch of its own
                members, counts = groups.setdefault(key, ([], [0]))
            members.append(request)
            counts[0] += rows
        return [(members, counts[0]) for members, counts in groups.values()]

    def _rows(self, request: Request) -> int:
        if not request.inputs:
            raise invalid_arg(f"request '{request.id}' for model '{self.model.name}' has no input")
        if not self.batching:
            return 1
        first = next(iter(request.inputs.values()))
        return checked_batch_size(first, self.max_batch_size, self.model.name)

    def _run(
        self, group: list[Request], rows: int, responses: dict[int, Response]
    ) -> tuple[int, int]:
        """Run one group; on failure every response of the group is its error, and nothing
        written for it stays allocated.  Returns (compute start, compute end)."""
        own = [responses[id(r)] for r in group]
        compute_start = now_ns()
        try:
            compute_start = self.binder.run(group, own, rows)
        except Exception as exc:
            err = InferpoolError.wrap(exc)
            for request, response in zip(group, own, strict=True):
                response.discard()
                responses[id(request)] = Response(request, err)
        return compute_start, now_ns()


class OnnxBackend(Backend):
    """The onnxruntime backend (Triton's name); onnxruntime is imported when it initializes."""

    model_class = OnnxModel
    instance_class = OnnxInstance
    ort: ModuleType

    def initialize(self) -> None:
        self.ort = extras.require("onnxruntime", self.name, "onnx")
        self.ort.set_default_logger_severity(3)  # errors only, as a library's should be
        self.log.info(
            "TRITONBACKEND_Initialize: %s (onnxruntime %s)", self.name, self.ort.__version__
        )
