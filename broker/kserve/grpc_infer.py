"""A gRPC ``ModelInferRequest`` as a zmq ``infer`` message, and a reply as a
``ModelInferResponse``.

Inputs bring their bytes in ``raw_input_contents`` (one entry per input that is neither
typed nor in shared memory, in order: what tritonclient sends), in typed ``contents``
(encoded here), or from a registered region (``shared_memory_*`` parameters).  Outputs are
answered in ``raw_output_contents``, one entry per output (empty for an output written into
a region), as Triton does; the answer is built at the wire format (``grpc_wire``).  An
output asked for as classes (``classification``) is answered as ``kserve.classification``
says.  Checks that belong to admission are left to the broker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from inferpool.broker.kserve import classification
from inferpool.broker.kserve.grpc_wire import answer_bytes
from inferpool.wire import codec
from inferpool.wire.errors import invalid_arg

EMPTY_FINAL = "triton_enable_empty_final_response"
# datatype -> the typed field of InferTensorContents that carries it
_TYPED = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# a typed field -> the datatype Triton names it by in its error
_FIELD_TYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}
_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


# ============================================================================ parameters
def parameters(entries: Mapping[str, Any]) -> dict[str, Any]:
    """A protobuf parameter map (``InferParameter`` values) as plain values."""
    out = {}
    for key, param in entries.items():
        kind = param.WhichOneof("parameter_choice")
        out[key] = getattr(param, kind) if kind else None
    return out


def set_parameters(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a protobuf parameter map from plain values."""
    for key, value in values.items():
        param = target[key]
        if isinstance(value, bool):
            param.bool_param = value
        elif isinstance(value, int):
            if value >= 1 << 63:
                param.uint64_param = value
            else:
                param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = value if isinstance(value, str) else str(value)


# ============================================================================ the request
class InferMessage(NamedTuple):
    """A gRPC inference request as the broker gets it, and how to answer it."""

    header: dict[str, Any]
    frames: list[Any]
    empty_final: bool  # an empty final response is wanted (streams)
    classes: dict[str, int]  # output -> the classes it is answered with (classification)


def infer_message(
    request: pb.ModelInferRequest, single_response: bool, raw: Sequence[Any] | None = None
) -> InferMessage:
    """The zmq header and tensor frames of ``request``, whether an empty final response is
    wanted (``triton_enable_empty_final_response``, for streams) and the outputs asked for
    as classes.  ``raw``: the raw inputs when they were read apart from the message
    (``grpc_wire``)."""
    model = request.model_name
    params = parameters(request.parameters)
    empty_final = bool(params.pop(EMPTY_FINAL, False))
    if any(k.startswith("triton_") for k in params):
        raise invalid_arg(
            "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
            f"following keys starting with 'triton_' are allowed: {EMPTY_FINAL}"
        )
    if raw is None:
        raw = request.raw_input_contents
    used = 0
    frames: list[Any] = []
    inputs = []
    for io in request.inputs:
        entry: dict[str, Any] = {"name": io.name, "datatype": io.datatype, "shape": list(io.shape)}
        io_params = parameters(io.parameters)
        if io_params:
            entry["parameters"] = io_params
        has_contents = io.HasField("contents")
        if "shared_memory_region" in io_params:
            if has_contents:
                raise invalid_arg(
                    "unexpected 'content' provided when using shared memory for input tensor "
                    f"'{io.name}' for model '{model}'"
                )
        elif has_contents:
            if raw:
                raise invalid_arg(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{io.name}' for model '{model}'"
                )
            frames.append(typed_bytes(io, model))
        elif used < len(raw):
            frames.append(raw[used])
            used += 1
        else:
            raise invalid_arg(
                f"unable to find data for input tensor '{io.name}' for model '{model}' in request."
            )
        inputs.append(entry)
    if used != len(raw):
        raise invalid_arg(
            f"request for model '{model}' has {len(raw)} raw_input_contents but its inputs "
            f"use {used}"
        )
    header: dict[str, Any] = {
        "type": "infer",
        "id": request.id,
        "model_name": model,
        "model_version": request.model_version,
        "inputs": inputs,
    }
    if single_response:
        header["single_response"] = True
    if params:
        header["parameters"] = params
    classes: dict[str, int] = {}
    if request.outputs:
        header["outputs"] = [_output(out, classes) for out in request.outputs]
    return InferMessage(header, frames, empty_final, classes)


def _output(out: Any, classes: dict[str, int]) -> dict[str, Any]:
    """The output as the broker gets it; ``classes`` records a classification."""
    count = classification.grpc_count(out.parameters)
    if count:
        classes[out.name] = count
    params = parameters(out.parameters)
    entry: dict[str, Any] = {"name": out.name}
    shm = {k: params[k] for k in _SHM_KEYS if k in params}
    if shm:
        entry["parameters"] = shm
    return entry


def typed_bytes(io: Any, model: str) -> bytes:
    """The wire bytes of an input given in typed ``contents``."""
    contents = io.contents
    given = [f.name for f, _ in contents.ListFields()]
    wanted = _TYPED.get(io.datatype)
    if given and given != [wanted]:
        raise invalid_arg(
            f"unexpected explicit tensor data for input tensor '{io.name}' for model "
            f"'{model}' of type '{_FIELD_TYPE[given[0]]}', expected datatype '{io.datatype}'"
        )
    if wanted is None:
        raise invalid_arg(
            f"input tensor '{io.name}' for model '{model}': {io.datatype} has no typed "
            "contents field; send it in raw_input_contents"
        )
    values = getattr(contents, wanted)
    if io.datatype == "BYTES":
        return codec.serialize_bytes(values)
    try:
        return np.asarray(values, dtype=codec.numpy_dtype(io.datatype)).tobytes()
    except OverflowError as exc:
        raise invalid_arg(f"contents of input tensor '{io.name}': {exc}") from None


# ============================================================================ the answer
def infer_response(reply: dict[str, Any], tensors: list[Any], final: bool | None = None) -> bytes:
    """``reply`` as Triton answers, a serialized ``ModelInferResponse`` (``tensors``: the
    buffers of its outputs that are not in a client's region, in order, each copied once);
    ``final`` (streams) sets ``triton_final_response``, and the answer is then serialized
    as a ``ModelStreamInferResponse``."""
    resp = pb.ModelInferResponse(
        model_name=reply.get("model_name", ""),
        model_version=reply.get("model_version", ""),
        id=str(reply.get("id", "")),
    )
    params = dict(reply.get("parameters") or {})
    params.pop("triton_final_response", None)
    if final is not None:
        params["triton_final_response"] = final
    set_parameters(resp.parameters, params)
    it = iter(tensors)
    raw = []
    for out in reply.get("outputs", ()):
        tensor = resp.outputs.add(name=out["name"], datatype=out["datatype"], shape=out["shape"])
        if codec.in_shared_memory(out):
            set_parameters(tensor.parameters, out["parameters"])
            raw.append(b"")
        else:
            raw.append(next(it))
    return answer_bytes(resp, raw, streamed=final is not None)
