"""An HTTP inference request as a zmq ``infer`` message, and its reply as the HTTP body.

KServe v2's JSON already uses the zmq protocol's field names, so a request maps almost one
to one: each input brings its bytes as JSON ``data`` (encoded here), as binary data after
the JSON header (Triton's binary tensor extension: ``Inference-Header-Content-Length`` and
``binary_data_size``; the bytes are sliced out of the body, not copied), or from a
registered region (``shared_memory_*`` parameters, passed through).  Outputs come back as
JSON ``data`` or, when ``binary_data`` (or the request's ``binary_data_output``) asks,
as binary data after the JSON header; an output asked for as classes (``classification``)
is answered as ``kserve.classification`` says.  Checks that belong to admission (names,
datatypes, shapes, sizes) are left to the broker, whose messages the client reads unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from inferpool.broker.kserve import classification
from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError, invalid_arg

# what a request's ``parameters`` may not set: Triton keeps the prefix for itself
_RESERVED = "triton_"
_SHM_KEYS = ("shared_memory_region", "shared_memory_offset", "shared_memory_byte_size")


@dataclass
class InferCall:
    """The zmq message of one HTTP inference request and how to shape its answer."""

    header: dict[str, Any]
    frames: list[Any]
    binary: dict[str, bool] = field(default_factory=dict)  # output -> binary (else JSON)
    at: list[int | None] = field(default_factory=list)  # each frame's offset in the binary part
    binary_default: bool = False  # for outputs the request did not name
    classes: dict[str, int] = field(default_factory=dict)  # output -> classes (classification)


def parse_body(body: Any, header_length: int | None, model: str, version: str) -> InferCall:
    """The request ``body`` (JSON, then binary tensors when ``header_length`` is given)."""
    view = memoryview(body)
    if header_length is None:
        return parse_request(view, None, model, version)
    return parse_request(view[:header_length], view[header_length:], model, version)


def parse_request(head: Any, binary: Any, model: str, version: str) -> InferCall:
    """The request: its JSON ``head``, then ``binary`` (the binary tensors, a buffer; None
    when the request has no ``Inference-Header-Content-Length``)."""
    try:
        request = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(request, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected an object")
    inputs = request.get("inputs")
    if not isinstance(inputs, list):
        raise invalid_arg("Unable to parse 'inputs'")
    request_id = request.get("id", "")
    if not isinstance(request_id, str):
        raise invalid_arg("Unable to parse 'id'")
    frames: list[Any] = []
    at: list[int | None] = []
    wire_inputs = []
    view = memoryview(binary if binary is not None else b"").cast("B")
    pos = 0
    for inp in inputs:
        if not isinstance(inp, dict):
            raise invalid_arg("Unable to parse 'inputs'")
        name, datatype, shape = _describe(inp)
        params = _parameters(inp, f"input '{name}'")
        source = _content_kind(inp, params)
        if source == "binary":
            size = params.pop("binary_data_size")
            if binary is None:
                raise invalid_arg(
                    "must specify valid 'Infer-Header-Content-Length' in request header and "
                    "'binary_data_size' when passing inputs in binary data format"
                )
            if type(size) is not int or size < 0:
                raise invalid_arg("Unable to parse 'binary_data_size'")
            if pos + size > len(view):
                raise invalid_arg(
                    f"unexpected size for input '{name}', expecting {pos + size - len(view)} "
                    f"additional bytes for model '{model}'"
                )
            frames.append(view[pos : pos + size])
            at.append(pos)
            pos += size
        elif source == "data":
            frames.append(json_to_bytes(name, datatype, shape, inp["data"]))
            at.append(None)
        wire: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if params:
            wire["parameters"] = params
        wire_inputs.append(wire)
    if pos != len(view):
        raise invalid_arg(f"unexpected additional input data for model '{model}'")
    parameters = _parameters(request, "the request")
    binary_default = parameters.pop("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise invalid_arg("Unable to parse 'binary_data_output'")
    if any(k.startswith(_RESERVED) for k in parameters):
        raise invalid_arg(
            "parameter keys starting with 'triton_' are reserved for Triton usage and should "
            "not be specified."
        )
    header: dict[str, Any] = {
        "type": "infer",
        "id": request_id,
        "model_name": model,
        "model_version": version,
        "inputs": wire_inputs,
        "single_response": True,
    }
    if parameters:
        header["parameters"] = parameters
    call = InferCall(header, frames, binary_default=binary_default, at=at)
    outputs = request.get("outputs")
    if outputs:
        header["outputs"] = _outputs(outputs, call)
    return call


def _describe(inp: dict[str, Any]) -> tuple[str, str, list[int]]:
    name, datatype, shape = inp.get("name"), inp.get("datatype"), inp.get("shape")
    if not isinstance(name, str):
        raise invalid_arg("Unable to parse 'name'")
    if not isinstance(datatype, str):
        raise invalid_arg("Unable to parse 'datatype'")
    return name, datatype, codec.check_shape(shape, f"input '{name}'")


def _content_kind(inp: dict[str, Any], params: dict[str, Any]) -> str:
    """``data``, ``binary`` or ``shm``: exactly one, in Triton's words otherwise."""
    found = [
        kind
        for kind, present in (
            ("data", "data" in inp),
            ("binary", "binary_data_size" in params),
            ("shm", "shared_memory_region" in params),
        )
        if present
    ]
    if len(found) == 1:
        return found[0]
    names = {"data": "'data'", "binary": "'binary_data_size'", "shm": "'shared_memory_region'"}
    detail = " no field is set" if not found else " set " + " ".join(names[k] for k in found)
    raise invalid_arg(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But" + detail
    )


def _outputs(raw: Any, call: InferCall) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise invalid_arg("Unable to parse 'outputs'")
    wire = []
    for out in raw:
        name = out.get("name") if isinstance(out, dict) else None
        if not isinstance(name, str):
            raise invalid_arg("Unable to parse 'name'")
        params = _parameters(out, f"output '{name}'")
        count = classification.http_count(params)
        if count:
            call.classes[name] = count
        binary = params.get("binary_data", call.binary_default)
        if not isinstance(binary, bool):
            raise invalid_arg("Unable to set 'binary_data'")
        entry: dict[str, Any] = {"name": name}
        if "shared_memory_region" in params:
            if params.get("binary_data"):
                raise invalid_arg("Output can't set both 'shared_memory_region' and 'binary_data'")
            entry["parameters"] = {k: params[k] for k in _SHM_KEYS if k in params}
        call.binary[name] = binary
        wire.append(entry)
    return wire


# ============================================================================ JSON tensors
def json_to_bytes(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    """An input's JSON ``data`` (flat or nested, row-major) as its wire bytes."""
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(
            f"receiving {datatype} data via JSON is not supported. Please use the binary data "
            f"format for input {name}"
        )
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=np.object_).reshape(-1)
            expected = codec.element_count(shape)
            if flat.size != expected:
                raise ValueError(f"{flat.size} elements for {expected}")
            return codec.serialize_bytes(flat)
        array = np.asarray(data, dtype=codec.numpy_dtype(datatype))
    except InferpoolError:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        raise invalid_arg(f"Unable to parse 'data' of input '{name}': {exc}") from None
    if array.size != codec.element_count(shape):
        raise invalid_arg(
            f"Unable to parse 'data' of input '{name}': shape does not match true shape of "
            f"'data' field ({array.size} elements for shape {shape})"
        )
    return array.tobytes()


def bytes_to_json(name: str, datatype: str, shape: list[int], buf: Any) -> list[Any]:
    """An output's wire bytes as the flat JSON ``data`` list Triton writes."""
    array = codec.array_from_buffer(buf, datatype, shape, f"output '{name}'").reshape(-1)
    if datatype != "BYTES":
        return list(array.tolist())
    try:
        return [bytes(b).decode("utf-8") for b in array]
    except UnicodeDecodeError:
        raise invalid_arg(
            f"output '{name}' holds bytes that are not UTF-8; request it with binary_data"
        ) from None


# ============================================================================ the answer
def response_body(
    call: InferCall, reply: dict[str, Any], frames: list[Any]
) -> tuple[bytes, list[Any]]:
    """The JSON header of the HTTP body and the binary outputs that follow it."""
    body: dict[str, Any] = {}
    if call.header["id"]:
        body["id"] = call.header["id"]
    body["model_name"] = reply.get("model_name", "")
    body["model_version"] = reply.get("model_version", "")
    if reply.get("parameters"):
        body["parameters"] = reply["parameters"]
    outputs = []
    binaries: list[Any] = []
    it = iter(frames)
    for out in reply.get("outputs", ()):
        name, datatype, shape = out["name"], out["datatype"], out["shape"]
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        if codec.in_shared_memory(out):
            entry["parameters"] = out["parameters"]
        else:
            buf = next(it)
            if call.binary.get(name, call.binary_default):
                entry["parameters"] = {"binary_data_size": len(buf)}
                binaries.append(buf)
            else:
                entry["data"] = bytes_to_json(name, datatype, shape, buf)
        outputs.append(entry)
    body["outputs"] = outputs
    return orjson.dumps(body), binaries


def _parameters(holder: dict[str, Any], what: str) -> dict[str, Any]:
    """A copy of the ``parameters`` object of ``holder`` (``what``: the request, an input or
    an output, named in the error); none is an empty one."""
    params = holder.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise invalid_arg(
            f"'parameters' of {what} must be a JSON object, got {type(params).__name__} "
            f"{orjson.dumps(params)[:40].decode(errors='replace')}"
        )
    return dict(params)
