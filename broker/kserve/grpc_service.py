"""The KServe v2 gRPC frontend: Triton's ``inference.GRPCInferenceService``.

Served with the servicer base class and message types tritonclient ships (the protobuf
layer is theirs), on ``grpc.aio`` in the frontends' asyncio loop.  Each RPC is one zmq
protocol message through the channel; an error reply aborts the RPC with the broker's
message and Triton's status code, except in ``ModelStreamInfer``, where, as in Triton, it
travels in the stream as ``error_message`` and the stream goes on.  Each call is made for
its caller (``kserve.callers``), looked up once per call (once per stream).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any, NoReturn, TypeAlias

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc.service_pb2_grpc import GRPCInferenceServiceServicer

from inferpool.broker.kserve.broker_channel import BrokerChannel
from inferpool.broker.kserve.callers import Callers
from inferpool.broker.kserve.classification import EXTENSION, Labels, ModelClasses, classify
from inferpool.broker.kserve.grpc_handlers import Malformed
from inferpool.broker.kserve.grpc_infer import InferMessage, infer_message, infer_response
from inferpool.broker.kserve.grpc_wire import InferCall
from inferpool.broker.kserve.health import HEALTH_TIMEOUT_S
from inferpool.broker.kserve.input_region import Inputs
from inferpool.broker.kserve.load import load_message
from inferpool.broker.kserve.status import GRPC_STATUS
from inferpool.wire import trace_stamps
from inferpool.wire.errors import Code, InferpoolError

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


async def _abort(context: Context, err: InferpoolError) -> NoReturn:
    await context.abort(GRPC_STATUS[err.code], err.message)
    raise AssertionError("unreachable: abort raises")


def _parameter(value: Any) -> Any:
    """The value a ModelRepositoryParameter holds (None when it holds none)."""
    which = value.WhichOneof("parameter_choice")
    return None if which is None else getattr(value, which)


def _unsupported_repository(name: str) -> None:
    if name:
        raise InferpoolError(Code.UNSUPPORTED, "'repository_name' specification is not supported")


class InferenceServicer(GRPCInferenceServiceServicer):
    """Triton's gRPC inference service, answered by the broker over its socket."""

    def __init__(
        self,
        channel: BrokerChannel,
        callers: Callers,
        address: str,
        port: int,
        inputs: Inputs,
        labels: Labels,
    ) -> None:
        """``address``, ``port``: where this servicer's server listens; ``inputs``: where
        large tensors are written; ``labels``: those of outputs asked for as classes."""
        self.channel = channel
        self.callers = callers
        self.address = address
        self.port = port
        self.inputs = inputs
        self.labels = labels

    def _caller(self, context: Context) -> bytes:
        return self.callers.of_grpc(context, self.address, self.port)

    async def _ask(
        self,
        context: Context,
        header: dict[str, Any],
        timeout: float | None = None,
        frames: Sequence[bytes] = (),
    ) -> dict[str, Any]:
        try:
            reply, _ = await self.channel.call(self._caller(context), header, frames, timeout)
        except InferpoolError as err:
            await _abort(context, err)
        return reply

    # ------------------------------------------------------------------ health
    async def ServerLive(self, request: Any, context: Context) -> pb.ServerLiveResponse:
        reply = await self._ask(context, {"type": "health_live"}, HEALTH_TIMEOUT_S)
        return pb.ServerLiveResponse(live=bool(reply.get("live")))

    async def ServerReady(self, request: Any, context: Context) -> pb.ServerReadyResponse:
        reply = await self._ask(context, {"type": "health_ready"}, HEALTH_TIMEOUT_S)
        return pb.ServerReadyResponse(ready=bool(reply.get("ready")))

    async def ModelReady(self, request: Any, context: Context) -> pb.ModelReadyResponse:
        header = {
            "type": "model_ready",
            "model_name": request.name,
            "model_version": request.version,
        }
        try:
            caller = self._caller(context)
            reply, _ = await self.channel.call(caller, header, timeout=HEALTH_TIMEOUT_S)
        except InferpoolError as err:
            if err.code is not Code.NOT_FOUND:  # Triton: an unknown model is not ready
                await _abort(context, err)
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=bool(reply.get("ready")))

    # ------------------------------------------------------------------ metadata
    async def ServerMetadata(self, request: Any, context: Context) -> pb.ServerMetadataResponse:
        reply = await self._ask(context, {"type": "server_metadata"})
        return pb.ServerMetadataResponse(
            name=reply["name"],
            version=reply["version"],
            extensions=[*reply["extensions"], EXTENSION],  # the frontends' own
        )

    def _model(self, request: Any, kind: str) -> dict[str, Any]:
        return {"type": kind, "model_name": request.name, "model_version": request.version}

    async def ModelMetadata(self, request: Any, context: Context) -> pb.ModelMetadataResponse:
        reply = await self._ask(context, self._model(request, "model_metadata"))
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=reply["name"],
            versions=reply["versions"],
            platform=reply["platform"],
            inputs=[tensor(**t) for t in reply["inputs"]],
            outputs=[tensor(**t) for t in reply["outputs"]],
        )

    async def ModelConfig(self, request: Any, context: Context) -> pb.ModelConfigResponse:
        reply = await self._ask(context, self._model(request, "model_config"))
        config = json_format.ParseDict(
            reply["config"], model_config_pb2.ModelConfig(), ignore_unknown_fields=True
        )
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, request: Any, context: Context) -> pb.ModelStatisticsResponse:
        reply = await self._ask(context, self._model(request, "statistics"))
        return json_format.ParseDict(
            {"model_stats": reply["model_stats"]},
            pb.ModelStatisticsResponse(),
            ignore_unknown_fields=True,
        )

    async def TraceSetting(self, request: Any, context: Context) -> pb.TraceSettingResponse:
        """Triton's trace extension: a setting (global, or the request's model's), after the
        changes the request asks for (an empty value clears one)."""
        header: dict[str, Any] = {"type": "trace_setting", "model_name": request.model_name}
        if request.settings:
            header["settings"] = {k: list(v.value) for k, v in request.settings.items()}
        reply = await self._ask(context, header)
        response = pb.TraceSettingResponse()
        for key, value in reply["settings"].items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def LogSettings(self, request: Any, context: Context) -> pb.LogSettingsResponse:
        """Triton's logging extension: the settings, after the changes the request asks for
        (each value in the field its type takes: bool, uint32 or string)."""
        header: dict[str, Any] = {"type": "log_settings"}
        if request.settings:
            header["settings"] = {k: _parameter(v) for k, v in request.settings.items()}
        reply = await self._ask(context, header)
        response = pb.LogSettingsResponse()
        for key, value in reply["settings"].items():
            field = {bool: "bool_param", int: "uint32_param"}.get(type(value), "string_param")
            setattr(response.settings[key], field, value)
        return response

    # ------------------------------------------------------------------ repository
    async def RepositoryIndex(self, request: Any, context: Context) -> pb.RepositoryIndexResponse:
        try:
            _unsupported_repository(request.repository_name)
        except InferpoolError as err:
            await _abort(context, err)
        reply = await self._ask(context, {"type": "repository_index", "ready": request.ready})
        row = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[row(**r) for r in reply["models"]])

    async def _control(self, request: Any, context: Context, action: str) -> None:
        frames: list[bytes] = []
        try:
            _unsupported_repository(request.repository_name)
            header: dict[str, Any] = {"type": action, "model_name": request.model_name}
            if action == "load":
                params = {k: _parameter(v) for k, v in request.parameters.items()}
                header, frames = load_message(request.model_name, params, decode_files=False)
        except InferpoolError as err:
            await _abort(context, err)
        await self._ask(context, header, frames=frames)

    async def RepositoryModelLoad(
        self, request: Any, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        await self._control(request, context, "load")
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: Any, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        await self._control(request, context, "unload")
        return pb.RepositoryModelUnloadResponse()

    # ------------------------------------------------------------------ shared memory
    async def _regions(self, context: Context, kind: str, name: str, status: Any) -> Any:
        """``status`` (the RPC's response type) of the ``kind`` regions, or of ``name``."""
        reply = await self._ask(context, {"type": f"{kind}_shared_memory_status", "name": name})
        return status(regions={r["name"]: status.RegionStatus(**r) for r in reply["regions"]})

    async def _unregister(self, context: Context, kind: str, name: str) -> None:
        await self._ask(context, {"type": f"unregister_{kind}_shared_memory", "name": name})

    async def SystemSharedMemoryStatus(
        self, request: Any, context: Context
    ) -> pb.SystemSharedMemoryStatusResponse:
        return await self._regions(
            context, "system", request.name, pb.SystemSharedMemoryStatusResponse
        )

    async def SystemSharedMemoryRegister(
        self, request: Any, context: Context
    ) -> pb.SystemSharedMemoryRegisterResponse:
        header = {
            "type": "register_system_shared_memory",
            "name": request.name,
            "key": request.key,
            "offset": request.offset,
            "byte_size": request.byte_size,
        }
        await self._ask(context, header)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, request: Any, context: Context
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self._unregister(context, "system", request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def CudaSharedMemoryStatus(
        self, request: Any, context: Context
    ) -> pb.CudaSharedMemoryStatusResponse:
        return await self._regions(context, "cuda", request.name, pb.CudaSharedMemoryStatusResponse)

    async def CudaSharedMemoryRegister(
        self, request: Any, context: Context
    ) -> pb.CudaSharedMemoryRegisterResponse:
        header = {
            "type": "register_cuda_shared_memory",
            "name": request.name,
            "raw_handle": base64.b64encode(request.raw_handle).decode(),
            "device_id": request.device_id,
            "byte_size": request.byte_size,
        }
        await self._ask(context, header)
        return pb.CudaSharedMemoryRegisterResponse()

    async def CudaSharedMemoryUnregister(
        self, request: Any, context: Context
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        await self._unregister(context, "cuda", request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ------------------------------------------------------------------ inference
    async def ModelInfer(self, call: InferCall, context: Context) -> bytes:
        """``call``: the request read by ``grpc_wire``; the answer: serialized there."""
        received = time.monotonic_ns()  # GRPC_WAITREAD_START and _END, for a trace
        caller = self._caller(context)
        try:
            header, frames, _, classes = infer_message(
                call.request, single_response=True, raw=call.raw
            )
        except InferpoolError as err:
            await _abort(context, err)
        header[trace_stamps.FIELD] = trace_stamps.received("GRPC", received, received)
        placed, frames, slot = self.inputs.place(frames)
        answered = None
        if slot is not None:
            header["placed"] = placed
            answered = partial(self.inputs.free, slot)
        try:
            async with self.channel.infer(caller, header, frames, answered) as (reply, tensors):
                tensors = await self.labels.apply(caller, reply, tensors, classes)
                response = infer_response(reply, tensors)
        except InferpoolError as err:
            await _abort(context, err)
        traced = trace_stamps.trace_id(reply)
        if traced:  # GRPC_SEND_END once the call has ended
            start, loop = time.monotonic_ns(), asyncio.get_running_loop()
            stamp = partial(self._sent, caller, traced, start)
            context.add_done_callback(lambda _: loop.call_soon_threadsafe(stamp))
        return response

    def _sent(self, caller: bytes, traced: int, start_ns: int) -> None:
        self.channel.notify(
            caller, trace_stamps.sent("GRPC", traced, start_ns, time.monotonic_ns())
        )

    async def ModelStreamInfer(
        self, request_iterator: AsyncIterator[InferCall | Malformed], context: Context
    ) -> AsyncIterator[bytes]:
        """Each request read by ``grpc_wire``, each response serialized there."""
        stream = _Stream(self.channel, self._caller(context), self.labels)
        reader = asyncio.ensure_future(stream.read(request_iterator))
        try:
            while (response := await stream.queue.get()) is not None:
                yield response
                if stream.traced:  # GRPC_SEND_END of a traced request's final response
                    stream.sent(response)
        finally:
            reader.cancel()
            stream.close()


class _Stream:
    """One ``ModelStreamInfer`` call: requests go out as they come, responses are queued as
    the broker sends them (a decoupled model's several per request); ``None`` ends it."""

    def __init__(self, channel: BrokerChannel, caller: bytes, labels: Labels) -> None:
        self.channel = channel
        self.caller = caller
        self.labels = labels
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()  # serialized responses
        self.open: dict[bytes, str] = {}  # tag -> id of the requests not yet answered
        self.reading = True
        # id() of a traced request's final response -> (its trace, when it was queued)
        self.traced: dict[int, tuple[int, int]] = {}

    async def read(self, requests: AsyncIterator[InferCall | Malformed]) -> None:
        """Send each request as it comes; the stream ends once the client's side has ended
        (or failed) and every request sent has had its final response."""
        try:
            async for call in requests:
                if isinstance(call, Malformed):  # answered in the stream, which goes on
                    self.queue.put_nowait(_stream_error(pb.ModelInferRequest(), call.message))
                    continue
                received = time.monotonic_ns()
                request = call.request
                try:
                    message = infer_message(request, single_response=False, raw=call.raw)
                    message.header[trace_stamps.FIELD] = trace_stamps.received(
                        "GRPC", received, received
                    )
                    model = None  # the labels of the version asked for, when it asks for classes
                    if message.classes:
                        model = await self.labels.of(
                            self.caller, request.model_name, request.model_version
                        )
                except InferpoolError as err:
                    self.queue.put_nowait(_stream_error(request, err.message))
                    continue
                self._send(request, message, model)
        finally:
            self.reading = False
            self._maybe_end()

    def _send(self, request: Any, message: InferMessage, model: ModelClasses | None) -> None:
        tag = b""
        empty_final = message.empty_final

        def reply(answer: dict[str, Any], outputs: list[Any]) -> None:
            traced = trace_stamps.trace_id(answer)
            params = answer.get("parameters") or {}
            decoupled = "triton_final_response" in params
            final = bool(params.get("triton_final_response", True))
            err = answer.get("error")
            if err is not None:
                self.queue.put_nowait(_stream_error(request, str(err.get("message", "")), final))
            elif answer.get("outputs") or not (decoupled and final) or empty_final:
                # a decoupled model's empty final response only marks the end: sent on request
                tensors, leases = self.channel.borrow(answer, outputs)
                try:
                    if model is not None:
                        tensors = classify(answer, tensors, message.classes, model)
                    streamed = infer_response(answer, tensors, final)
                except InferpoolError as failed:  # an output that cannot be classified
                    streamed = _stream_error(request, failed.message, final)
                finally:
                    self.channel.release(self.caller, leases)
                if traced:
                    self.traced[id(streamed)] = (traced, time.monotonic_ns())
                    traced = 0
                self.queue.put_nowait(streamed)
            if traced:  # its final response is not sent: nothing more to stamp
                now = time.monotonic_ns()
                self.channel.notify(self.caller, trace_stamps.sent("GRPC", traced, now, now))
            if final:
                self.channel.forget(tag)
                self.open.pop(tag, None)
                self._maybe_end()

        tag = self.channel.open(self.caller, message.header, message.frames, reply)
        self.open[tag] = request.id

    def sent(self, response: bytes) -> None:
        """``response`` went out: if it is a traced request's final one, say when."""
        found = self.traced.pop(id(response), None)
        if found is not None:
            traced, start = found
            stamps = trace_stamps.sent("GRPC", traced, start, time.monotonic_ns())
            self.channel.notify(self.caller, stamps)

    def _maybe_end(self) -> None:
        if not self.reading and not self.open:
            self.queue.put_nowait(None)

    def close(self) -> None:
        """The stream ended: requests still unanswered (the client cancelled the call or
        went away) are cancelled at the broker."""
        for tag, request_id in self.open.items():
            self.channel.cancel(self.caller, tag, request_id)
        self.open.clear()


def _stream_error(request: Any, message: str, final: bool = True) -> bytes:
    response = pb.ModelInferResponse(
        id=request.id, model_name=request.model_name, model_version=request.model_version
    )
    response.parameters["triton_final_response"].bool_param = final
    streamed = pb.ModelStreamInferResponse(error_message=message, infer_response=response)
    return streamed.SerializeToString()
