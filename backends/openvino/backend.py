"""The OpenVINO backend: Triton's openvino backend over inferpool's worker API.

The model is ``<version>/model.xml`` (with its ``model.bin``) or what
``default_model_filename`` names (``model.onnx``: OpenVINO reads ONNX too).  The config is
completed from the model and checked against it (``backends.model_io``: OpenVINO's rules).
Triton's parameters: ``NUM_STREAMS`` (AUTO, NUMA or a number), ``PERFORMANCE_HINT``
(LATENCY, THROUGHPUT, CUMULATIVE_THROUGHPUT), ``INFERENCE_NUM_THREADS`` (default: the cores
the instance is pinned to), ``COMPILATION_NUM_THREADS``, ``HINT_BF16``, ``CPU_EXTENSION_PATH``,
``TARGET_DEVICE`` (CPU by default), ``SKIP_OV_DYNAMIC_BATCHSIZE``, ``ENABLE_BATCH_PADDING``.

A batching model's batch dimension is made variable, so that any batch up to
``max_batch_size`` runs as it is.  Where the model fixes it (``SKIP_OV_DYNAMIC_BATCHSIZE``,
or a graph that cannot take another batch size), a batch must hold exactly the model's batch
size, or is padded with zeros to it under ``ENABLE_BATCH_PADDING`` (Triton's rule).  Inputs
are handed to OpenVINO over the memory they lie in; a lone request's outputs of known shape
are written by OpenVINO into the response's slot; batches of several requests are joined
and split with one copy each way.  Ragged inputs, batch inputs and batch outputs are
Triton's (``backends.batch_io``), as its onnxruntime backend has them.
"""

from __future__ import annotations

import ctypes
import os
from types import ModuleType
from typing import Any

import numpy as np

from inferpool.backends import extras, model_io
from inferpool.backends.api import (
    Backend,
    Model,
    ModelInstance,
    Request,
    Response,
    batch_size_of,
    now_ns,
)
from inferpool.backends.batch_io import BatchIO
from inferpool.backends.spans import Joiner
from inferpool.backends.threads import pinned_cores
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError, internal, invalid_arg, unavailable

DEFAULT_FILENAME = "model.xml"
_NUMBERS = ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS")
_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")


def _yes(model: Model, key: str) -> bool:
    return (model.parameter(key) or "").strip().lower() == "yes"


def device_properties(model: Model) -> dict[str, Any]:
    """The compile properties the config's parameters ask for (Triton's checks and words)."""
    props: dict[str, Any] = {"INFERENCE_NUM_THREADS": pinned_cores()}
    for key in _NUMBERS:
        raw = model.parameter(key)
        if raw is not None:
            if not raw.strip().isdigit():
                raise invalid_arg(
                    f"expected the parameter '{key}' to be a non-negative number, got {raw.lower()}"
                )
            props[key] = int(raw)
    streams = model.parameter("NUM_STREAMS")
    if streams is not None:
        value = streams.strip().upper()
        if value not in ("AUTO", "NUMA") and not value.isdigit():
            raise invalid_arg(
                "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got "
                f"{streams.lower()}"
            )
        props["NUM_STREAMS"] = value
    hint = model.parameter("PERFORMANCE_HINT")
    if hint is not None:
        if hint.strip().upper() not in _HINTS:
            raise invalid_arg(
                "expected the parameter 'PERFORMANCE_HINT' to be LATENCY/THROUGHPUT/"
                f"CUMULATIVE_THROUGHPUT, got {hint.lower()}"
            )
        props["PERFORMANCE_HINT"] = hint.strip().upper()
    bf16 = model.parameter("HINT_BF16")
    if bf16 is not None:
        if bf16.strip().lower() != "yes":
            raise invalid_arg(f"expected the parameter 'HINT_BF16' to be YES, got {bf16.lower()}")
        props["INFERENCE_PRECISION_HINT"] = "bf16"
    return props


def tensors(ports: list[Any], names: set[str]) -> list[model_io.ModelTensor]:
    """A model's inputs or outputs, each under the one of its names the config uses
    (``names``), else its first."""
    out = []
    for port in ports:
        known = port.get_names() & names
        name = sorted(known)[0] if known else port.get_any_name()
        try:
            datatype = codec.datatype_of(port.get_element_type().to_dtype())
            config_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
        except Exception:
            config_type = "TYPE_INVALID"
        shape = tuple(d.get_length() if d.is_static else -1 for d in port.get_partial_shape())
        out.append(model_io.ModelTensor(name, config_type, shape))
    return out


def config_names(config: Any) -> set[str]:
    """The tensor names a config uses: its inputs, outputs and batch inputs."""
    return {
        *(t.name for t in (*config.input, *config.output)),
        *model_io.batch_input_targets(config),
    }


def _writable(array: np.ndarray) -> np.ndarray:
    """A view of ``array``'s memory that OpenVINO takes without a copy (it wants writable
    arrays; it never writes an input)."""
    raw = (ctypes.c_char * array.nbytes).from_address(array.__array_interface__["data"][0])
    return np.frombuffer(memoryview(raw), dtype=array.dtype).reshape(array.shape)


class OpenVinoModel(Model):
    """An OpenVINO model: read, its config completed, compiled once for the model's instances."""

    backend: OpenVinoBackend

    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_ModelInitialize: %s (version %d)", self.name, self.version)
        ov = self.backend.ov
        core = self.backend.core
        extension = self.parameter("CPU_EXTENSION_PATH")
        if extension:
            core.add_extension(extension)
        self.device = (self.parameter("TARGET_DEVICE") or "CPU").strip().upper()
        self.properties = device_properties(self)
        path = os.path.join(
            self.artifact_path, self.config.default_model_filename or DEFAULT_FILENAME
        )
        if not os.path.exists(path):
            raise unavailable(f"unable to find '{path}' for model '{self.name}'")
        try:
            model = core.read_model(path)
        except Exception as exc:
            raise unavailable(f"failed to load model '{self.name}' from '{path}': {exc}") from None
        named = config_names(self.config)
        inputs, outputs = tensors(model.inputs, named), tensors(model.outputs, named)
        default = model_io.default_max_batch_size(self.backend.config, self.backend.name)
        batching = model_io.can_batch(inputs, outputs) or all(
            ov.layout_helpers.get_layout(p).has_name("N") for p in (*model.inputs, *model.outputs)
        )
        if self.config.max_batch_size and not batching:
            self.log.warning(
                "model layout for model %s does not support batching while non-zero "
                "max_batch_size is specified",
                self.name,
            )
            batching = True  # the config says the first dimension is the batch: trust it
        if self.auto_complete_config:
            self.set_config(
                model_io.autocomplete(
                    self.config, self.name, inputs, outputs, batching, max(default, 1), self.log
                )
            )
        model_io.check_inputs(self.config, self.name, inputs, model_io.OPENVINO_RULES)
        model_io.check_outputs(self.config, self.name, outputs, model_io.OPENVINO_RULES)
        self.batch_io = BatchIO(self.config)
        self.static_batch = self._batch_dimension(ov, model, path)
        self.compiled = core.compile_model(self.model_file, self.device, self.properties)

    def _batch_dimension(self, ov: ModuleType, model: Any, path: str) -> int:
        """Make a batching model's batch dimension variable where it can be; the batch size
        the model keeps fixed, else 0."""
        self.model_file = model
        if self.max_batch_size == 0:
            return 0
        first = [p.get_partial_shape()[0] for p in model.inputs]
        if all(d.is_dynamic for d in first):
            return 0
        fixed = first[0].get_length()
        if _yes(self, "SKIP_OV_DYNAMIC_BATCHSIZE"):
            return fixed
        try:
            shapes = {}
            for port in model.inputs:
                shape = port.get_partial_shape()
                shape[0] = ov.Dimension()
                shapes[port.get_any_name()] = shape
            model.reshape(shapes)
            if all(p.get_partial_shape()[0].is_dynamic for p in model.outputs):
                return 0
        except Exception as exc:
            self.log.info("model '%s' keeps its batch size %d: %s", self.name, fixed, exc)
        self.model_file = self.backend.core.read_model(path)  # as it was
        return fixed

    def finalize(self) -> None:
        del self.compiled


class OpenVinoInstance(ModelInstance):
    """One OpenVINO infer request bound to the responses' output slots."""

    model: OpenVinoModel

    def initialize(self) -> None:
        if self.kind != "CPU":
            raise invalid_arg(
                f"unable to load model '{self.model.name}', Triton OpenVINO backend supports only "
                "Kind CPU and AUTO"
            )
        # one request whose outputs are always bound to a response's slots (every output, at
        # every run: none is left pointing at an earlier response's), one with its own outputs
        self.placing = self.model.compiled.create_infer_request()
        self.request = self.model.compiled.create_infer_request()
        model = self.model
        named = config_names(model.config)
        self.outputs = {
            t.name: (i, codec.config_to_wire_datatype(t.config_type), t.shape)
            for i, t in enumerate(tensors(model.model_file.outputs, named))
        }
        self.inputs = [t.name for t in tensors(model.model_file.inputs, named)]
        self.batching = self.model.max_batch_size > 0
        self.joiners: dict[str, Joiner] = {}  # by input name: the buffers batches are joined in

    def execute(self, requests: list[Request]) -> None:
        exec_start = now_ns()
        responses = [Response(r) for r in requests]
        rows = sum(batch_size_of(r, True) for r in requests) if self.batching else len(requests)
        compute_start = compute_end = exec_start
        try:
            if self.batching and rows > self.model.max_batch_size:
                raise internal(
                    f"batch size {rows} for '{self.name}', max allowed is "
                    f"{self.model.max_batch_size}"
                )
            compute_start, compute_end = self._run(requests, responses, rows)
        except Exception as exc:
            err = InferpoolError.wrap(exc)
            for i, request in enumerate(requests):
                responses[i].discard()
                responses[i] = Response(request, err)
        for request, response in zip(requests, responses, strict=True):
            request.respond(response)
        exec_end = now_ns()
        for request, response in zip(requests, responses, strict=True):
            ok = response.error is None
            self.report_statistics(request, ok, exec_start, compute_start, compute_end, exec_end)
        self.report_batch_statistics(rows, exec_start, compute_start, compute_end, exec_end)

    def _run(
        self, requests: list[Request], responses: list[Response], rows: int
    ) -> tuple[int, int]:
        ov = self.model.backend.ov
        static = self.model.static_batch
        pad = 0
        if static and rows != static:
            if not _yes(self.model, "ENABLE_BATCH_PADDING"):
                raise internal(
                    f"expected requests with batch size '{static}', got '{rows}'... this error "
                    "can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in model "
                    "configuration to 'YES' at a performance cost."
                )
            pad = static - rows
        kept = []
        batch_io = self.model.batch_io
        built = batch_io.build(requests)
        for name in self.inputs:
            if name in built:
                data = built[name]
            else:
                arrays = [r.input(name).data for r in requests]
                if name in batch_io.ragged:
                    arrays = [BatchIO.flat(a) for a in arrays]
                if len(arrays) == 1:
                    data = arrays[0]
                else:
                    data, _ = self.joiners.setdefault(name, Joiner()).join(arrays)
            if pad:
                data = np.concatenate([data, np.zeros((pad, *data.shape[1:]), data.dtype)])
            view = _writable(np.ascontiguousarray(data))
            kept.append((data, view))
        placed = not pad and self._placed(requests, responses, rows)
        infer = self.placing if placed else self.request
        for i, (_, view) in enumerate(kept):
            infer.set_input_tensor(i, ov.Tensor(view, shared_memory=True))
        compute_start = now_ns()
        try:
            infer.infer()
        except Exception as exc:
            raise internal(f"openvino error: {exc}") from None
        compute_end = now_ns()
        if placed:
            return compute_start, compute_end
        for name, (index, datatype, _) in self.outputs.items():
            data = infer.get_output_tensor(index).data
            if name in batch_io.outputs:  # split by its source input's shapes
                parts = batch_io.scatter(name, data, requests)
                for request, response, part in zip(requests, responses, parts, strict=True):
                    if name in request.requested_outputs:
                        response.set_output(name, part, datatype)
                continue
            row = 0
            for request, response in zip(requests, responses, strict=True):
                n = batch_size_of(request, True) if self.batching else 0
                part = data[row : row + n] if self.batching else data
                row += n
                if name in request.requested_outputs:
                    response.set_output(name, part, datatype)
        del kept
        return compute_start, compute_end

    def _placed(self, requests: list[Request], responses: list[Response], rows: int) -> bool:
        """Bind every output of a lone request to its response's slot, where each has a
        known shape and is asked for: True; else nothing is bound."""
        if len(requests) != 1 or self.model.batch_io.outputs:
            return False
        wanted = requests[0].requested_outputs
        shapes = {}
        for name, (_, _, shape) in self.outputs.items():
            dims = (rows, *shape[1:]) if self.batching else shape
            if name not in wanted or any(d < 0 for d in dims):
                return False
            shapes[name] = dims
        ov = self.model.backend.ov
        for name, (index, datatype, _) in self.outputs.items():
            target = responses[0].output(name, shapes[name], datatype)
            self.placing.set_output_tensor(index, ov.Tensor(target, shared_memory=True))
        return True


class OpenVinoBackend(Backend):
    """The openvino backend (Triton's name); openvino is imported when it initializes."""

    model_class = OpenVinoModel
    instance_class = OpenVinoInstance
    ov: ModuleType

    def initialize(self) -> None:
        self.ov = extras.require("openvino", self.name, "openvino")
        self.core = self.ov.Core()
        self.log.info("TRITONBACKEND_Initialize: %s (openvino %s)", self.name, self.ov.__version__)
