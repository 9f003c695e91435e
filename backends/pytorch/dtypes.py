"""Datatypes between the model config, the wire and torch, and zero-copy views as tensors.

The config types torch can hold are those of the seed's ``ModelConfigDataTypeToTorchType``;
``TYPE_STRING`` is not a tensor type but travels as ``List[str]``.

Inputs are read-only views of shared memory; torch has no read-only tensors (the backend
never writes to an input) and warns of the first read-only array ``torch.from_numpy`` takes,
once per process.  That one warning is taken here, silently, at import, so that inputs go
through ``from_numpy`` (a third of DLPack's cost per call); should a torch warn of every such
array, read-only arrays go through DLPack, which takes them without a copy or a warning.
Device arrays (GPU inputs, outputs in a client's CUDA region: cupy arrays) go through DLPack
too: numpy's calls and attributes (``flags.writeable``, ``torch.from_numpy``) do not apply to
them.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2

_TORCH: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
    "BF16": torch.bfloat16,
}
_WIRE: dict[torch.dtype, str] = {v: k for k, v in _TORCH.items()}


def config_type_name(data_type: int) -> str:
    """The protobuf enum value as the config spells it: ``TYPE_FP32``."""
    return str(model_config_pb2.DataType.Name(data_type))


def wire_datatype(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def supported(config_type: str) -> bool:
    """Whether torch can hold a tensor of this config type (TYPE_STRING is a list, not a tensor)."""
    return config_type.startswith("TYPE_") and config_type.removeprefix("TYPE_") in _TORCH


def torch_dtype(datatype: str) -> torch.dtype | None:
    """The torch dtype of a wire datatype, None for BYTES (a list of strings)."""
    return _TORCH.get(datatype)


def datatype_of(dtype: torch.dtype) -> str:
    """The wire datatype of a torch dtype, ``INVALID`` for those Triton cannot carry."""
    return _WIRE.get(dtype, "INVALID")


def _read_only_warned() -> bool:
    """Take ``from_numpy``'s warning of a read-only array, silently; whether later ones are
    silent (torch warns once per process)."""
    probe = np.zeros(1, np.uint8)
    probe.flags.writeable = False
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.from_numpy(probe)
        first = len(seen)
        torch.from_numpy(probe)
        return len(seen) == first


FROM_NUMPY_READ_ONLY = _read_only_warned()


def as_tensor(array: Any) -> torch.Tensor:
    """A tensor over the same memory as ``array`` (no copy): a numpy array, bfloat16
    included, or a device array (cupy, torch: any DLPack producer)."""
    if not isinstance(array, np.ndarray):
        return array if isinstance(array, torch.Tensor) else torch.from_dlpack(array)
    if array.dtype.itemsize == 2 and array.dtype.name == "bfloat16":
        return as_tensor(array.view(np.uint16)).view(torch.bfloat16)
    if FROM_NUMPY_READ_ONLY or array.flags.writeable:
        return torch.from_numpy(array)
    return torch.from_dlpack(array)
