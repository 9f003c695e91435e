"""Tensors a model config describes by their data: zeros, random bytes, or a data file.

Triton builds warm-up samples (``model_warmup``: ``zero_data``, ``random_data``,
``input_data_file`` in ``<model>/warmup/``) and initial sequence states (``initial_state``:
``zero_data``, ``data_file`` in ``<model>/initial_state/``) the same way, so both use this.
A file holds the tensor's bytes as they travel on the wire: raw little-endian elements, or
for TYPE_STRING each element as a 4-byte length and its bytes.  :func:`input_tensor` makes
such an array (or any host array a worker or harness builds) a request's read-only input.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from inferpool.backends.request_io import InputTensor
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, invalid_arg


def input_tensor(name: str, datatype: str, data: np.ndarray) -> InputTensor:
    """``data`` as a request's input: made read-only (as every input a backend gets), with
    its byte size (BYTES: serialized, a length prefix per element)."""
    if datatype == "BYTES":
        nbytes = codec.serialized_bytes_size(data.reshape(-1))
    else:
        data.flags.writeable = False
        nbytes = data.nbytes
    return InputTensor(name, datatype, tuple(data.shape), data, nbytes)


def zeros(datatype: str, shape: Sequence[int]) -> np.ndarray:
    """Zeros; for BYTES, empty strings (a zero length prefix per element)."""
    if datatype == "BYTES":
        return codec.bytes_array([b""] * codec.element_count(shape), shape)
    return np.zeros(tuple(shape), dtype=codec.numpy_dtype(datatype))


def random(datatype: str, shape: Sequence[int]) -> np.ndarray:
    """Random bytes as the datatype's elements (BOOL: 0 or 1; BYTES: zeros, as Triton)."""
    if datatype == "BYTES":
        return zeros(datatype, shape)
    rng = np.random.default_rng()
    if datatype == "BOOL":
        return rng.integers(0, 2, tuple(shape)).astype(np.bool_)
    dtype = codec.numpy_dtype(datatype)
    raw = rng.integers(0, 256, codec.element_count(shape) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(tuple(shape))


def from_file(
    folder: str, name: str, datatype: str, shape: Sequence[int], setting: str
) -> np.ndarray:
    """The tensor in ``folder/name``; ``setting`` ("warmup", "initial_state") names the config
    section in errors.  A fixed-size file may be longer than the tensor: the rest is unused."""
    path = os.path.join(folder, name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise InferpoolError(
            Code.INVALID_ARG, f"failed to read {setting} data file {path}: {exc.strerror}"
        ) from None
    what = f"{setting} data from {name}"
    if datatype == "BYTES":
        return codec.array_from_buffer(data, datatype, shape, what)
    dtype = codec.numpy_dtype(datatype)
    needed = codec.element_count(shape) * dtype.itemsize
    if len(data) < needed:
        raise invalid_arg(
            f"{setting} setting expects {needed} bytes, but the data provided from {name} "
            f"only has {len(data)} bytes"
        )
    return np.frombuffer(data, dtype=dtype, count=needed // dtype.itemsize).reshape(tuple(shape))
