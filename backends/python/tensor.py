"""``pb_utils.Tensor`` and the datatype helpers, over inferpool's wire datatypes.

An input Tensor wraps the request's zero-copy view of shared memory; an output Tensor holds
the model's array until the response copies it into the output arena (one copy, as Triton's
python backend makes into its own shared memory).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2

from inferpool.wire import codec
from inferpool.wire.errors import InferpoolError


class TritonModelException(Exception):
    """Raised by pb_utils calls the model made wrongly; ``message()`` as in Triton."""

    def message(self) -> str:
        return str(self)


def _config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _wire_type(config_type: str) -> str:
    datatype = codec.config_to_wire_datatype(config_type)
    if datatype not in codec.DATATYPES:
        raise TritonModelException(f"unknown Triton data type '{config_type}'")
    return datatype


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32`` (``np.object_`` for ``TYPE_STRING``)."""
    return codec.numpy_dtype(_wire_type(triton_type_string)).type


def triton_to_numpy_type(data_type: int) -> Any:
    """A ``model_config_pb2.DataType`` number -> the numpy scalar type."""
    try:
        name = model_config_pb2.DataType.Name(data_type)
    except ValueError:
        raise TritonModelException(f"unknown Triton data type {data_type}") from None
    return triton_string_to_numpy(name)


def numpy_to_triton_type(dtype: Any) -> int:
    """A numpy dtype -> its ``model_config_pb2.DataType`` number (``TYPE_STRING`` for bytes)."""
    try:
        datatype = codec.datatype_of(dtype)
    except (InferpoolError, TypeError) as exc:
        raise TritonModelException(f"numpy dtype {dtype!r} has no Triton data type") from exc
    return int(model_config_pb2.DataType.Value(_config_type(datatype)))


class Tensor:
    """A named tensor: ``Tensor(name, numpy_array)`` for outputs, or a request's input."""

    def __init__(self, name: str, numpy_array: Any) -> None:
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        try:
            self._datatype = codec.datatype_of(array.dtype)
        except InferpoolError as err:
            raise TritonModelException(f"tensor '{name}': {err.message}") from None
        self._name = name
        self._data: Any = array
        self._cpu = True
        self._shared: tuple[str, int, int] | None = None
        self._lent = False

    @classmethod
    def _wrap(
        cls,
        name: str,
        datatype: str,
        data: Any,
        cpu: bool,
        shared: tuple[str, int, int] | None = None,
        lent: bool = False,
    ) -> Tensor:
        """A Tensor over existing memory (no copy): request inputs, BLS outputs, DLPack
        imports.  ``shared``: (region, offset, byte size) where the bytes lie in shared
        memory, so that a BLS call passes the tensor on without copying it; ``lent``:
        that memory is a BLS reply's, which a response may also answer with in place."""
        tensor = cls.__new__(cls)
        tensor._name, tensor._datatype, tensor._data, tensor._cpu = name, datatype, data, cpu
        tensor._shared, tensor._lent = shared, lent
        return tensor

    @classmethod
    def from_dlpack(cls, name: str, dlpack: Any) -> Tensor:
        """A Tensor sharing the memory of a DLPack capsule or of any ``__dlpack__`` object."""
        if not hasattr(dlpack, "__dlpack__"):  # a bare capsule: torch can take it over
            import torch.utils.dlpack

            dlpack = torch.utils.dlpack.from_dlpack(dlpack)
        if codec.device_of(dlpack) is None:
            array = np.from_dlpack(dlpack)
            return cls._wrap(name, codec.datatype_of(array.dtype), array, cpu=True)
        return cls._wrap(name, codec.datatype_of(dlpack.dtype), dlpack, cpu=False)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        """The data as a numpy array; a request's inputs are read-only views of shared memory."""
        if not self._cpu:
            raise TritonModelException(
                f"tensor '{self._name}' is stored in GPU memory and cannot be converted to "
                "NumPy; use to_dlpack()"
            )
        return self._data

    def is_cpu(self) -> bool:
        return self._cpu

    def shape(self) -> list[int]:
        return [int(d) for d in self._data.shape]

    def triton_dtype(self) -> int:
        return int(model_config_pb2.DataType.Value(_config_type(self._datatype)))

    def datatype(self) -> str:
        """The wire datatype name (``FP32``, ``BYTES``...)."""
        return self._datatype

    def to_dlpack(self) -> Any:
        """A DLPack capsule over the same memory (no copy); read-only inputs stay read-only."""
        if self._datatype == "BYTES":
            raise TritonModelException(f"tensor '{self._name}': BYTES tensors have no DLPack form")
        try:
            return self._data.__dlpack__(max_version=(1, 0))
        except TypeError:  # a producer that predates DLPack 1.0
            return self._data.__dlpack__()

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._data.__dlpack_device__()

    def __repr__(self) -> str:
        return f"Tensor({self._name!r}, {self._datatype}, shape={self.shape()})"
