"""Run a backend in this process, without a broker: for backend authors' unit tests.

    with BackendHarness("identity", CONFIG_PBTXT) as h:
        out = h.infer({"INPUT0": np.arange(4, dtype=np.int32)})

The harness runs the real lifecycle host (``backends.host``, which workers run too) over
ordinary process memory instead of shared memory.  Harnesses given one :class:`LocalRegions`
share regions (weights) the way a broker's workers do, with this process in the broker's part.
A sequence model's requests get the control inputs and, at their START, the initial states
a worker adds (``backends.sequence``); the harness keeps no state between requests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from inferpool.backends import tensor_data
from inferpool.backends.api import (
    FLAG_SEQUENCE_START,
    Request,
    RequestedOutput,
    Response,
)
from inferpool.backends.host import BackendHost
from inferpool.backends.reshape import output_reshapes, to_config_shape
from inferpool.backends.sequence import SequenceInputs
from inferpool.backends.shared_regions import SharedRegion
from inferpool.shm.shared import SharedRegionTable
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.spec import InstanceSpec


class HeapMemory:
    """OutputMemory over private bytearrays (shared memory is the worker's business).

    A buffer released goes back to a spare list of its size, under its number, and the next
    output of that size takes it, as a worker's outputs take the slot the last one freed:
    a backend runs here as it runs in a worker, its views of output slots made once
    (``slot_views``).  Past ``SPARE`` spare buffers all are dropped, with their views."""

    SPARE = 64

    def __init__(self) -> None:
        self._buffers: dict[int, bytearray] = {}  # by number ("offset"), those allocated
        self._spare: dict[int, list[tuple[int, bytearray]]] = {}  # by size, those released
        self._spares = 0
        self._views: dict[Any, Any] = {}
        self._next = 0

    def allocate(self, output: RequestedOutput | None, nbytes: int) -> tuple[str, int, Any]:
        spare = self._spare.get(nbytes)
        if spare:
            number, buf = spare.pop()
            self._spares -= 1
        else:
            self._next += 1
            number, buf = self._next, bytearray(nbytes)
        self._buffers[number] = buf
        return "heap", number, memoryview(buf)  # host memory, as a worker's arena gives it

    def release(self, region: str, offset: int) -> None:
        buf = self._buffers.pop(offset, None)
        if buf is None:
            return
        if self._spares >= self.SPARE:  # the views go with the buffers they see
            self._spare.clear()
            self._views.clear()
            self._spares = 0
        self._spares += 1
        spare = self._spare.get(len(buf))
        if spare is None:
            self._spare[len(buf)] = [(offset, buf)]
        else:
            spare.append((offset, buf))

    def slot_views(self, region: str) -> dict[Any, Any]:
        return self._views

    def read(self, offset: int) -> bytearray:
        return self._buffers[offset]

    def held(self) -> int:
        """How many buffers are allocated and not released (a backend's leak shows here)."""
        return len(self._buffers)


class LocalRegions:
    """The broker's table of shared regions (``shm.shared``), kept in this process for the
    harnesses given it; ``close()`` unlinks whatever is left."""

    def __init__(self, run_id: str) -> None:
        self.table = SharedRegionTable(run_id)

    def close(self) -> None:
        self.table.close()


class _HarnessRegions:
    """One harness's ``SharedRegions``: the harness is the owner, as a worker is."""

    def __init__(self, regions: LocalRegions, owner: object) -> None:
        self.table = regions.table
        self.owner = owner

    def share(self, key: str, byte_size: int) -> SharedRegion:
        try:
            grant = self.table.ask(self.owner, key, byte_size)
        except (ValueError, OSError) as exc:
            raise InferpoolError(Code.INVALID_ARG, f"cannot share region '{key}': {exc}") from None
        if grant is None:  # one process, one load at a time: only a fill left undone
            raise InferpoolError(
                Code.UNAVAILABLE, f"shared region '{key}' was never filled by the harness asked to"
            )
        return SharedRegion(grant.name, grant.fill)

    def filled(self, key: str, ok: bool) -> None:
        self.table.filled(self.owner, key, ok)

    def release(self) -> None:
        self.table.release(self.owner)


class BackendHarness(AbstractContextManager["BackendHarness"]):
    """Load ``backend`` for a model configured by ``config_pbtxt`` and send it requests."""

    def __init__(
        self,
        backend: str,
        config_pbtxt: str,
        *,
        repository_path: str = "",
        version: int = 1,
        instance: dict[str, Any] | None = None,
        backend_directory: str = "",
        backend_config: dict[str, str] | None = None,
        regions: LocalRegions | None = None,
    ) -> None:
        config = text_format.Parse(config_pbtxt, model_config_pb2.ModelConfig())
        self.config = config
        self.memory = HeapMemory()
        self.responses: list[tuple[Request, Response | None, bool]] = []
        self.cancelled: set[int] = set()  # request handles (``request.handle``) cancelled
        self._regions = _HarnessRegions(regions, self) if regions is not None else None
        self.host = BackendHost(
            backend_name=backend,
            model_name=config.name or "model",
            model_version=version,
            config_json=json_format.MessageToJson(config, preserving_proto_field_name=True),
            repository_path=repository_path,
            artifact_path=os.path.join(repository_path, str(version)) if repository_path else "",
            instance=InstanceSpec(**(instance or {"name": f"{config.name or 'model'}_0_0"})),
            backend_directory=backend_directory,
            backend_config=backend_config,
            shared_regions=self._regions,
        )
        try:
            self.host.load()
            self.sequence = SequenceInputs.of(
                self.host.config, self.host.model_name, repository_path
            )
        except BaseException:
            self.host.close()
            self._release()
            raise
        self._next_id = 0

    def request(
        self,
        inputs: dict[str, Any],
        outputs: list[str] | None = None,
        *,
        parameters: dict[str, Any] | None = None,
        correlation_id: int | str = 0,
        flags: int = 0,
    ) -> Request:
        """Build a request whose inputs are (read-only) numpy arrays."""
        self._next_id += 1
        tensors = {}
        for name, value in inputs.items():
            arr = codec.as_array(value)
            datatype = codec.datatype_of(arr.dtype)
            if datatype != "BYTES":
                arr = arr.copy()  # made read-only: not the caller's array
            tensors[name] = tensor_data.input_tensor(name, datatype, arr)
        if self.sequence is not None and correlation_id:
            batch = next(iter(tensors.values())).shape[0] if self.host.config.max_batch_size else 1
            request_id = str(self._next_id)
            self.sequence.add_controls(tensors, correlation_id, flags, batch, True, request_id)
            if flags & FLAG_SEQUENCE_START:
                self.sequence.add_initial_states(tensors, batch)
        wanted = outputs if outputs is not None else [o.name for o in self.host.config.output]
        return Request(
            id=str(self._next_id),
            inputs=tensors,
            requested_outputs={n: RequestedOutput(n) for n in wanted},
            memory=self.memory,
            emit=self._emit,
            correlation_id=correlation_id,
            flags=flags,
            parameters=parameters,
            decoupled=self.host.decoupled,
            handle=self._next_id,
            cancelled=self.cancelled.__contains__,
        )

    def _emit(self, request: Request, response: Response | None, final: bool) -> None:
        self.responses.append((request, response, final))

    def execute(self, requests: list[Request]) -> list[tuple[Request, Response | None, bool]]:
        """Run one batch; returns every (request, response, final) the backend emitted."""
        start = len(self.responses)
        self.host.execute(requests)
        return self.responses[start:]

    def infer(
        self, inputs: dict[str, Any], outputs: list[str] | None = None, **kw: Any
    ) -> dict[str, np.ndarray]:
        """One request, one response: its outputs as numpy arrays (errors raise)."""
        [(_, response, _final)] = self.execute([self.request(inputs, outputs, **kw)])
        return self.outputs_of(response)

    def outputs_of(self, response: Response | None) -> dict[str, np.ndarray]:
        """The response's outputs as a client sees them (reshaped outputs in the config's
        dims, as the worker reports them).  None (only a final flag came) fails."""
        assert response is not None, "the backend sent no response, only the final flag"
        if response.error is not None:
            raise response.error
        config = self.host.config
        reshapes = output_reshapes(config)
        outputs = {}
        for name, out in response.outputs.items():
            shape = out.shape
            if name in reshapes:
                shape = to_config_shape(shape, reshapes[name], config.max_batch_size > 0)
            buf = self.memory.read(out.offset)
            outputs[name] = codec.array_from_buffer(buf, out.datatype, shape, f"output '{name}'")
        return outputs

    def stream(self, inputs: dict[str, Any], **kw: Any) -> Iterator[Response]:
        for _, response, _final in self.execute([self.request(inputs, **kw)]):
            if response is not None:
                yield response

    def close(self) -> None:
        self.host.close()
        self._release()

    def _release(self) -> None:
        """As the broker does when an instance stops: regions nobody else uses are unlinked."""
        if self._regions is not None:
            self._regions.release()

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BackendHarness", "HeapMemory", "InferpoolError", "LocalRegions"]
