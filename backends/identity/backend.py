"""Triton's identity backend in Python.

Semantics follow the seed identity.cc: INPUT<i>/OUTPUT<i> pairs with equal datatype and
(reshaped) shape, optional inputs answered with zeros, only requested outputs produced,
``execute_delay_ms`` / ``instance_wise_delay_multiplier`` / ``creation_delay_sec`` parameters,
response parameters param0..param3, the ``input_byte_size_counter`` metric, and per-request
errors that never sink the rest of the batch.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from inferpool.backends.api import (
    Backend,
    Model,
    ModelInstance,
    ParameterValue,
    Request,
    Response,
    batch_size_of,
    copy_into,
    now_ns,
)
from inferpool.backends.config_parameters import int_parameter
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, invalid_arg


def _shape_str(shape: list[int]) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


# The seed's example response parameters: one of each kind (string, int, bool, double).
SEED_PARAMETERS: dict[str, ParameterValue] = {
    "param0": "an example string parameter",
    "param1": 42,
    "param2": False,
    "param3": 123.123,
}


class IdentityModel(Model):
    """Triton's identity model: validates the config and reads its parameters once."""

    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_ModelInitialize: %s (version %d)", self.name, self.version)
        self.log.info("Repository location: %s", self.repository_path)
        self.optional_inputs: dict[int, tuple[str, list[int]]] = {}
        self._validate()
        # each output's input, named once: OUTPUT<i> answers with INPUT<i>
        self.sources = {o.name: "INPUT" + o.name[len("OUTPUT") :] for o in self.config.output}
        self.execute_delay_ms = int_parameter(self, "execute_delay_ms") or 0
        self.delay_multiplier = (
            int_parameter(self, "instance_wise_delay_multiplier") or 0
            if self.execute_delay_ms
            else 0
        )
        creation_delay = int_parameter(self, "creation_delay_sec") or 0
        if creation_delay > 0:
            self.log.info("Creation delay is set to: %d", creation_delay)
            time.sleep(creation_delay)
        self.supports_batching = self.max_batch_size > 0
        self.input_bytes = self.metric_family(
            "input_byte_size_counter",
            "Cumulative input byte size of all requests received by the model",
        ).metric(model=self.name, version=str(self.version))

    def _validate(self) -> None:
        cfg = self.config
        if len(cfg.input) != len(cfg.output):
            raise invalid_arg("model configuration must have equal input/output pairs")
        inputs: dict[str, tuple[str, list[int]]] = {}
        outputs: dict[str, tuple[str, list[int]]] = {}
        for inp, out in zip(cfg.input, cfg.output, strict=True):
            if not inp.name.startswith("INPUT"):
                raise invalid_arg(
                    f"expected input name to follow INPUT<index> pattern, got '{inp.name}'"
                )
            if not out.name.startswith("OUTPUT"):
                raise invalid_arg(
                    f"expected output name to follow OUTPUT<index> pattern, got '{out.name}'"
                )
            in_shape = list(inp.reshape.shape if inp.HasField("reshape") else inp.dims)
            out_shape = list(out.reshape.shape if out.HasField("reshape") else out.dims)
            in_type = model_type_name(inp.data_type)
            out_type = model_type_name(out.data_type)
            inputs[inp.name[len("INPUT") :]] = (in_type, in_shape)
            outputs[out.name[len("OUTPUT") :]] = (out_type, out_shape)
            if inp.optional:
                try:
                    idx = int(inp.name[len("INPUT") :])
                except ValueError:
                    raise invalid_arg(
                        f"expected input name to follow INPUT<index> pattern, got '{inp.name}'"
                    ) from None
                self.optional_inputs[idx] = (
                    codec.config_to_wire_datatype(in_type),
                    [1 if d == -1 else d for d in in_shape],
                )
        for index, (out_type, out_shape) in outputs.items():
            if index not in inputs:
                raise invalid_arg("expected input and output indices to match")
            in_type, in_shape = inputs[index]
            if in_type != out_type:
                raise invalid_arg(
                    f"expected input and output datatype to match, got {in_type} and {out_type}"
                )
            if in_shape != out_shape:
                raise invalid_arg(
                    "expected input and output shape to match, got "
                    f"{_shape_str(in_shape)} and {_shape_str(out_shape)}"
                )


def model_type_name(data_type: int) -> str:
    """The config's name of a data type (``TYPE_FP32``)."""
    return str(model_config_pb2.DataType.Name(data_type))


class IdentityInstance(ModelInstance):
    """Answers every request with its inputs as outputs, as identity.cc does."""

    model: IdentityModel
    answered_bytes = 0  # the bytes of the inputs answered in this execution (the metric's)

    def initialize(self) -> None:
        self.log.info(
            "TRITONBACKEND_ModelInstanceInitialize: %s (%s device %d)",
            self.name,
            self.kind,
            self.device_id,
        )
        if self.kind != "CPU":
            raise invalid_arg("'identity' backend only supports CPU instances")

    def execute(self, requests: list[Request]) -> None:
        """Each request is answered as soon as its outputs are written, and the statistics
        reported after all are sent, as identity.cc does: they are off the answer's path."""
        model = self.model
        exec_start = now_ns()
        compute_start = exec_start
        if model.execute_delay_ms > 0:
            multiplier = model.delay_multiplier * self.index if model.delay_multiplier > 0 else 0
            time.sleep(model.execute_delay_ms * max(multiplier, 1) / 1000.0)
        self.answered_bytes = 0
        responses = [self._answer(r) for r in requests]
        compute_end = now_ns()
        for request, response in zip(requests, responses, strict=True):
            request.respond(response)
        exec_end = now_ns()
        if self.answered_bytes:  # counted once per execution
            model.input_bytes.increment(self.answered_bytes)
        total_batch = (
            sum(batch_size_of(r, True) for r in requests)
            if model.supports_batching
            else len(requests)
        )
        for request, response in zip(requests, responses, strict=True):
            self.report_statistics(
                request, response.error is None, exec_start, compute_start, compute_end, exec_end
            )
        self.report_batch_statistics(total_batch, exec_start, compute_start, compute_end, exec_end)

    def _answer(self, request: Request) -> Response:
        model = self.model
        response = request.response()
        try:
            batch_dim = 0
            if model.supports_batching and request.inputs:
                first = next(iter(request.inputs.values()))
                batch_dim = first.shape[0] if first.shape else 0
            for name in request.requested_outputs:
                input_name = model.sources.get(name) or "INPUT" + name[len("OUTPUT") :]
                src = request.inputs.get(input_name)
                if src is not None:
                    self.answered_bytes += src.byte_size
                    if src.datatype == "BYTES":
                        response.set_output(name, src.data, "BYTES")
                    else:
                        copy_into(response.output(name, src.shape, src.datatype), src.data)
                    continue
                optional = model.optional_inputs.get(_index(input_name[len("INPUT") :]))
                if optional is None:
                    raise InferpoolError(Code.UNSUPPORTED, f"failed to get input '{input_name}'")
                datatype, shape = optional
                if batch_dim:
                    shape = [batch_dim, *shape]
                if datatype == "BYTES":
                    response.set_output(name, np.full(shape, b"", dtype=object), "BYTES")
                else:
                    response.output(name, shape, datatype)[...] = 0
        except InferpoolError as err:
            response.discard()
            return Response(request, err)
        response.parameters.update(SEED_PARAMETERS)
        return response


def _index(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


class IdentityBackend(Backend):
    """The identity backend (Triton's identity.cc in Python), the built-in example."""

    model_class = IdentityModel
    instance_class = IdentityInstance
    parallel_instance_loading = True

    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_Initialize: %s", self.name)
        self.log.info("backend configuration: %s", self.config)
        self.message: Any = "initialized"

    def finalize(self) -> None:
        self.log.info("TRITONBACKEND_Finalize: state is '%s'", self.message)


BACKEND = IdentityBackend
