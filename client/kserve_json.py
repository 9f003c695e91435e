"""KServe v2 JSON tensors (``name``, ``datatype``, ``shape``, ``data``) to numpy and back, for
clients that take HTTP requests and forward them over zmq (the Ray Serve adapter)."""

from __future__ import annotations

from typing import Any

import numpy as np

from inferpool.wire import codec
from inferpool.wire.errors import invalid_arg


def array(spec: dict[str, Any]) -> np.ndarray:
    """An input tensor's array; INVALID_ARG naming the input when its data does not fit."""
    datatype = spec["datatype"]
    shape = codec.check_shape(spec["shape"], f"input '{spec['name']}'")
    if datatype == "BYTES":
        values = [v.encode() if isinstance(v, str) else bytes(v) for v in spec["data"]]
        return codec.bytes_array(values, shape)
    arr = np.asarray(spec["data"], dtype=codec.numpy_dtype(datatype))
    if arr.size != codec.element_count(shape):
        raise invalid_arg(f"input '{spec['name']}': {arr.size} values for shape {shape}")
    return arr.reshape(shape)


def output(name: str, arr: np.ndarray) -> dict[str, Any]:
    """An output tensor as KServe v2 JSON (BYTES as text)."""
    flat = arr.reshape(-1)
    if arr.dtype == np.object_:
        data = [v.decode(errors="replace") if isinstance(v, bytes) else v for v in flat]
    else:
        data = flat.tolist()
    return {
        "name": name,
        "datatype": codec.datatype_of(arr.dtype),
        "shape": list(arr.shape),
        "data": data,
    }
