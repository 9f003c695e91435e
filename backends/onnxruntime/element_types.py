"""ONNX Runtime's element types ("tensor(float)") against the config's (``TYPE_FP32``)."""

from __future__ import annotations

import numpy as np

# ONNX Runtime's type string -> the config's type; TYPE_STRING travels as BYTES
CONFIG_TYPES = {
    "tensor(bool)": "TYPE_BOOL",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(bfloat16)": "TYPE_BF16",
    "tensor(string)": "TYPE_STRING",
}


def config_type(ort_type: str) -> str:
    """The config's type of an ONNX Runtime type string; TYPE_INVALID for those Triton cannot
    carry (sequences, maps, float8...)."""
    return CONFIG_TYPES.get(ort_type, "TYPE_INVALID")


def element_type(dtype: np.dtype) -> type:
    """What IO binding takes as ``element_type``: numpy's scalar type (bfloat16 as the 2-byte
    integer ONNX Runtime's binding knows; only its size matters for a bound buffer)."""
    if dtype.name == "bfloat16":
        return np.uint16
    return dtype.type
