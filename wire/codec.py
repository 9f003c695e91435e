"""The wire codec shared by broker, workers and clients (docs/PROTOCOL.md is the contract).

A message is a zmq multipart: an empty delimiter frame, a JSON header frame, then raw tensor
frames.  This module knows datatypes, shapes, BYTES serialisation and the header encoding;
it knows nothing of sockets, so every process can import it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import orjson

from inferpool.wire.errors import Code, InferpoolError, invalid_arg

PROTOCOL_VERSION = 1

# KServe v2 / Triton datatype names -> numpy dtypes (little-endian, as on the wire).
_DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(np.object_),
}
DATATYPES: frozenset[str] = frozenset(_DTYPES)
_BY_DTYPE: dict[np.dtype[Any], str] = {v: k for k, v in _DTYPES.items()}


def numpy_dtype(datatype: str) -> np.dtype[Any]:
    """The numpy dtype of a wire datatype; INVALID_ARG for a name the protocol does not know."""
    try:
        return _DTYPES[datatype]
    except (KeyError, TypeError):
        raise invalid_arg(
            f"unknown datatype {datatype!r}; expected one of {', '.join(sorted(DATATYPES))}"
        ) from None


def datatype_of(dtype: Any) -> str:
    """The wire datatype of a numpy (or torch, cupy) dtype (str/bytes/object arrays are BYTES)."""
    if isinstance(dtype, np.dtype):  # the common case: an array's own dtype, one lookup
        known = _BY_DTYPE.get(dtype)
        if known is not None:
            return known
    if type(dtype).__module__ == "torch":  # torch.float32 -> "float32", as numpy names it
        dtype = str(dtype).removeprefix("torch.")
    dt = np.dtype(dtype)
    if dt.kind in "OSU":
        return "BYTES"
    name = _BY_DTYPE.get(dt.newbyteorder("<") if dt.byteorder == ">" else dt)
    if name is None:
        raise invalid_arg(f"numpy dtype {dt} has no inferpool datatype")
    return name


def fixed_datatype(dtype: np.dtype[Any]) -> str | None:
    """The wire datatype of a numpy dtype of fixed-size elements; None for any other
    (byte-swapped, object, str: ``datatype_of`` says what those are)."""
    datatype = _BY_DTYPE.get(dtype)
    return None if datatype == "BYTES" else datatype


def element_size(datatype: str) -> int:
    """Bytes per element; 0 for BYTES, whose elements vary in size."""
    if datatype == "BYTES":
        return 0
    return numpy_dtype(datatype).itemsize


def config_to_wire_datatype(config_type: str) -> str:
    """``TYPE_FP32`` (model config) -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def element_count(shape: Sequence[int]) -> int:
    """The number of elements of ``shape``."""
    return math.prod(shape)


def check_shape(shape: Any, what: str) -> list[int]:
    """A shape as a list of non-negative ints, or INVALID_ARG naming ``what``."""
    if not isinstance(shape, list | tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise invalid_arg(f"{what}: shape must be a list of non-negative integers, got {shape!r}")
    return list(shape)


# ----------------------------------------------------------------------------- BYTES tensors
_LEN = struct.Struct("<I")


def serialize_bytes(values: Iterable[Any]) -> bytes:
    """Triton's BYTES encoding: each element as a 4-byte little-endian length and its bytes."""
    parts: list[bytes] = []
    for v in values:
        b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        parts.append(_LEN.pack(len(b)))
        parts.append(b)
    return b"".join(parts)


def serialized_bytes_size(values: Iterable[Any]) -> int:
    """The bytes of BYTES elements serialized (a 4-byte length before each)."""
    return sum(4 + len(v.encode("utf-8") if isinstance(v, str) else bytes(v)) for v in values)


def deserialize_bytes(buf: Any, count: int, what: str = "BYTES tensor") -> list[bytes]:
    """Decode ``count`` length-prefixed elements filling ``buf`` exactly, or INVALID_ARG."""
    view = memoryview(buf).cast("B")
    out: list[bytes] = []
    pos, end = 0, len(view)
    for i in range(count):
        if pos + 4 > end:
            raise invalid_arg(f"{what}: data ends before element {i} of {count}")
        (n,) = _LEN.unpack_from(view, pos)
        pos += 4
        if pos + n > end:
            raise invalid_arg(f"{what}: element {i} claims {n} bytes but only {end - pos} remain")
        out.append(bytes(view[pos : pos + n]))
        pos += n
    if pos != end:
        raise invalid_arg(f"{what}: {end - pos} bytes left over after {count} elements")
    return out


def bytes_array(values: Sequence[bytes], shape: Sequence[int]) -> np.ndarray:
    """BYTES elements as a numpy object array of ``shape``."""
    arr = np.empty(len(values), dtype=np.object_)
    arr[:] = values
    return arr.reshape(shape)


# ----------------------------------------------------------------------------- tensors
def tensor_bytes(array: np.ndarray, datatype: str) -> Any:
    """The wire bytes of an array: a zero-copy buffer for fixed-size types."""
    if datatype == "BYTES":
        return serialize_bytes(array.reshape(-1))
    return np.ascontiguousarray(array, dtype=numpy_dtype(datatype)).data


def array_from_buffer(buf: Any, datatype: str, shape: Sequence[int], what: str) -> np.ndarray:
    """A numpy view (no copy) of ``buf`` as a tensor; BYTES decode into an object array."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return bytes_array(deserialize_bytes(buf, count, what), shape)
    dtype = _DTYPES.get(datatype) if type(datatype) is str else None
    if dtype is None:
        dtype = numpy_dtype(datatype)  # raises: not a datatype
    nbytes = buf.nbytes if type(buf) is memoryview else memoryview(buf).nbytes
    if nbytes != dtype.itemsize * count:
        raise invalid_arg(
            f"{what}: expected {dtype.itemsize * count} bytes for {datatype} shape {list(shape)}, "
            f"got {nbytes}"
        )
    return np.ndarray(shape, dtype, buf)  # one array over the buffer (not frombuffer + reshape)


# DLPack device types numpy can view: kDLCPU and kDLCUDAHost (pinned host memory).
DLPACK_HOST_DEVICES = (1, 3)


def device_of(value: Any) -> int | None:
    """The GPU ordinal a DLPack array (cupy, torch) lives on; None for host memory."""
    probe = getattr(value, "__dlpack_device__", None)
    if probe is None or isinstance(value, np.ndarray):
        return None
    kind, index = probe()
    return None if kind in DLPACK_HOST_DEVICES else int(index)


def host_array(value: Any) -> np.ndarray:
    """``value`` as a numpy array: a view of host memory, a blocking copy of device memory.

    numpy refuses device memory (``np.from_dlpack`` of a cupy array raises), so device
    arrays are copied by their own library: torch's ``cpu()``, cupy's ``get()``.
    """
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch: numpy() views a CPU tensor, cpu() copies a GPU one
        return np.asarray(value.detach().cpu().numpy())
    if device_of(value) is None:
        return np.from_dlpack(value) if hasattr(value, "__dlpack__") else np.asarray(value)
    if callable(getattr(value, "get", None)):  # cupy and its likes: device -> host
        return np.asarray(value.get())
    raise invalid_arg(
        f"cannot copy a {type(value).__name__} out of GPU memory; use a cupy array or a "
        "torch tensor"
    )


def as_array(value: Any, datatype: str | None = None) -> np.ndarray:
    """Accept numpy arrays, torch tensors, cupy arrays (copied to host memory), lists and
    scalars as tensors."""
    if not isinstance(value, np.ndarray) and hasattr(value, "__dlpack__"):
        value = host_array(value)
    if datatype == "BYTES":
        arr = np.asarray(value, dtype=np.object_)
    elif datatype is not None:
        arr = np.asarray(value, dtype=numpy_dtype(datatype))
    else:
        arr = np.asarray(value)
    return arr


def in_shared_memory(output: dict[str, Any]) -> bool:
    """Whether a response's output stayed in shared memory (no frame carries its bytes)."""
    params = output.get("parameters") or {}
    return "shared_memory_region" in params or "handle_region" in params


# ----------------------------------------------------------------------------- headers
def encode_header(header: dict[str, Any]) -> bytes:
    """A header frame: the header as JSON (numpy values included)."""
    return orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY)


def decode_header(raw: Any) -> dict[str, Any]:
    """Parse a header frame; malformed JSON or a non-object is INVALID_ARG, never a crash."""
    try:
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise invalid_arg(f"malformed header: not valid UTF-8 JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise invalid_arg(f"malformed header: expected a JSON object, got {type(obj).__name__}")
    return obj


def error_header(
    err: InferpoolError, request_id: Any = "", msg_type: str = "error"
) -> dict[str, Any]:
    """The header of an error response."""
    return {"type": msg_type, "id": request_id, "error": err.to_wire()}


def raise_for_error(header: dict[str, Any]) -> None:
    """Raise the InferpoolError a response header carries, if any."""
    err = header.get("error")
    if err is not None:
        raise InferpoolError.from_wire(err)


def protocol_check(header: dict[str, Any]) -> None:
    """UNSUPPORTED if the header speaks another protocol version."""
    version = header.get("protocol", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise InferpoolError(
            Code.UNSUPPORTED,
            f"protocol version {version!r} is not supported; this server speaks {PROTOCOL_VERSION}",
        )
