"""Requests as a C backend reads them: the host's Request, filled once per request.

What a backend reads many times per request (the id, each input's name, datatype, shape
and buffer, the requested outputs) lies in C structures, so reading it costs no call into
Python.  An input's structure is made once per input object: the worker hands out one
object for every request that names the same place in shared memory (InputTensor.made
keeps it), so a request that repeats a place builds nothing for its inputs.
"""

from __future__ import annotations

from typing import Any

from inferpool.backends.api import InputTensor
from inferpool.backends.cabi import library
from inferpool.wire import codec

# TRITONSERVER_DataType by the wire's datatype names
DATATYPES = {
    name: number
    for number, name in enumerate(
        (
            "INVALID", "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32",
            "INT64", "FP16", "FP32", "FP64", "BYTES", "BF16",
        )
    )
}  # fmt: skip
CPU, GPU = 0, 2


class RequestMaker:
    """Makes the host's C Request of each request a C backend's execute gets."""

    """What the host asks when it makes a request's C side (it reads the request's fields
    itself): an input not made yet, the parameters, the outputs to leave out."""

    def __init__(self, config: Any) -> None:
        self._input = library.host().Input
        # the state outputs a worker asks of every sequence request are not the client's:
        # a backend learns of state through TRITONBACKEND_StateNew, not as outputs
        self.hidden = frozenset(s.output_name for s in config.sequence_batching.state)
        self._names: dict[str, bytes] = {}

    def input(self, tensor: InputTensor) -> Any:
        """The host's Input for ``tensor``, kept with it where it views a lasting place."""
        name = self._names.get(tensor.name)
        if name is None:
            name = self._names[tensor.name] = tensor.name.encode()
        datatype = DATATYPES.get(tensor.datatype, 0)
        if tensor.memory != "cpu":
            data = tensor.data
            address = int(data.__cuda_array_interface__["data"][0])
            return self._input(
                name, datatype, tensor.shape, tensor.byte_size, address, GPU, tensor.device_id, data
            )
        if tensor.datatype == "BYTES":  # decoded elements: serialized again, as Triton has them
            payload = codec.serialize_bytes(tensor.data.reshape(-1))
            return self._input(name, datatype, tensor.shape, len(payload), payload, CPU, 0)
        made = self._input(name, datatype, tensor.shape, tensor.byte_size, tensor.data, CPU, 0)
        tensor.made = made
        return made

    def parameters(self, parameters: dict[str, Any]) -> tuple[tuple[bytes, Any], ...]:
        """A request's parameters as the host keeps them: strings as bytes."""
        return _parameters(parameters)


def _parameters(parameters: dict[str, Any]) -> tuple[tuple[bytes, Any], ...]:
    out = []
    for key, value in parameters.items():
        if isinstance(value, str):
            value = value.encode()
        elif not isinstance(value, bool | int | float):
            value = str(value).encode()
        out.append((key.encode(), value))
    return tuple(out)
