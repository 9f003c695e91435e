"""The KServe v2 HTTP/REST frontend: Triton's endpoints, each one zmq protocol message.

Routes, methods, bodies and status codes follow Triton's HTTP server (``/v2``, health,
model metadata, config, statistics, inference with the binary tensor and classification
extensions, the repository and the system / CUDA shared-memory extensions).  Each handler builds the
message a zmq client would send, awaits the broker's reply over the channel and reshapes
it into Triton's JSON; errors keep the broker's message and get Triton's status code.

Each call is made for its caller (``kserve.callers``): regions registered here belong to
the caller's user, and every HTTP and gRPC client of that user may use them (Triton's rule,
within one user); a client the frontends cannot identify may register none.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

import orjson
from aiohttp import web

from inferpool.broker.kserve import health
from inferpool.broker.kserve.bodies import BodyLimits
from inferpool.broker.kserve.broker_channel import BrokerChannel
from inferpool.broker.kserve.callers import Callers
from inferpool.broker.kserve.classification import EXTENSION, Labels
from inferpool.broker.kserve.http_base import JSON, application, json_response
from inferpool.broker.kserve.http_infer import response_body
from inferpool.broker.kserve.http_tensors import BINARY, HEADER_LENGTH, receive, stream
from inferpool.broker.kserve.input_region import Inputs
from inferpool.broker.kserve.load import load_message
from inferpool.wire import trace_stamps
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

log = logging.getLogger("inferpool.kserve")

STREAM_MIN = 64 * 1024  # binary outputs from this size on are written without being joined
_MODEL = "/v2/models/{model}"
_VERSIONED = (_MODEL, _MODEL + "/versions/{version:[0-9]+}")
_METADATA_FIELDS = ("name", "versions", "platform", "inputs", "outputs")
CONTROL_MAX = 1 << 20  # the body of a call that is not an inference


def build(
    channel: BrokerChannel, callers: Callers, bodies: BodyLimits, inputs: Inputs, labels: Labels
) -> web.Application:
    """The app: every Triton endpoint inferpool has, its bodies within ``bodies``."""
    api = _Api(channel, callers, bodies, inputs, labels)
    # inference first: aiohttp tries the routes under /v2/models in this order, each a
    # regular expression, and every other route there is called far less often
    routes = [web.post(base + "/infer", api.infer) for base in _VERSIONED]
    routes += [
        *health.routes(channel, callers),
        web.get("/v2", api.server_metadata, allow_head=False),
        web.get("/v2/logging", api.log_settings, allow_head=False),
        web.post("/v2/logging", api.log_settings),
        web.get("/v2/trace/setting", api.trace_setting, allow_head=False),
        web.post("/v2/trace/setting", api.trace_setting),
        web.get(_MODEL + "/trace/setting", api.trace_setting, allow_head=False),
        web.post(_MODEL + "/trace/setting", api.trace_setting),
        web.get("/v2/models/stats", api.statistics, allow_head=False),
        web.post("/v2/repository/index", api.repository_index),
        web.post("/v2/repository/models/{model}/{action:load|unload}", api.model_control),
        web.post("/v2/repository/{repository}/index", api.named_repository),
        web.post("/v2/repository/{repository}/models/{model}/{action}", api.named_repository),
    ]
    for base in _VERSIONED:
        routes += [
            web.get(base, api.model_metadata, allow_head=False),
            web.get(base + "/config", api.model_config, allow_head=False),
            web.get(base + "/stats", api.statistics, allow_head=False),
        ]
    for kind in ("system", "cuda"):
        for base in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
            routes += [
                web.get(base + "/status", api.shm_status, allow_head=False),
                web.post(base + "/unregister", api.shm_unregister),
            ]
        routes.append(web.post(f"/v2/{kind}sharedmemory/region/{{region}}/register", api.register))
    return application(routes, bodies.max_size)


def _model(request: web.Request) -> dict[str, str]:
    info = request.match_info
    return {"model_name": info["model"], "model_version": info.get("version", "")}


def _kind(request: web.Request) -> str:
    """``system`` or ``cuda``, from the path."""
    return "cuda" if request.path.startswith("/v2/cuda") else "system"


async def _json_body(
    request: web.Request, bodies: BodyLimits, limit: int = CONTROL_MAX
) -> dict[str, Any]:
    """The request's JSON object of at most ``limit`` bytes (0: the largest body); an empty
    body is an empty object."""
    raw = await bodies.read(request, limit)
    if not raw:
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise invalid_arg(f"failed to parse the request JSON buffer: {exc}") from None
    if not isinstance(body, dict):
        raise invalid_arg("failed to parse the request JSON buffer: expected an object")
    return body


class _Api:
    def __init__(
        self,
        channel: BrokerChannel,
        callers: Callers,
        bodies: BodyLimits,
        inputs: Inputs,
        labels: Labels,
    ) -> None:
        self.channel = channel
        self.callers = callers
        self.bodies = bodies
        self.inputs = inputs  # where large binary tensors are read
        self.labels = labels  # for outputs asked for as classes

    async def ask(
        self, request: web.Request, header: dict[str, Any], frames: Sequence[bytes] = ()
    ) -> dict[str, Any]:
        reply, _ = await self.channel.call(self.callers.of_http(request), header, frames)
        return reply

    # ------------------------------------------------------------------ metadata
    async def server_metadata(self, request: web.Request) -> web.Response:
        reply = await self.ask(request, {"type": "server_metadata"})
        extensions = [*reply["extensions"], EXTENSION]  # the frontends' own
        return json_response(
            {"name": reply["name"], "version": reply["version"], "extensions": extensions}
        )

    async def model_metadata(self, request: web.Request) -> web.Response:
        reply = await self.ask(request, {"type": "model_metadata", **_model(request)})
        return json_response({k: reply[k] for k in _METADATA_FIELDS if k in reply})

    async def model_config(self, request: web.Request) -> web.Response:
        reply = await self.ask(request, {"type": "model_config", **_model(request)})
        return json_response(reply["config"])

    async def statistics(self, request: web.Request) -> web.Response:
        header = {"type": "statistics"}
        if "model" in request.match_info:
            header.update(_model(request))
        reply = await self.ask(request, header)
        return json_response({"model_stats": reply["model_stats"]})

    async def log_settings(self, request: web.Request) -> web.Response:
        """Triton's logging extension: GET the settings, POST changes to some of them."""
        header: dict[str, Any] = {"type": "log_settings"}
        if request.method == "POST":
            header["settings"] = await _json_body(request, self.bodies)
        return json_response((await self.ask(request, header))["settings"])

    async def trace_setting(self, request: web.Request) -> web.Response:
        """Triton's trace extension: GET a setting (global, or a model's), POST changes."""
        header: dict[str, Any] = {
            "type": "trace_setting",
            "model_name": request.match_info.get("model", ""),
        }
        if request.method == "POST":
            header["settings"] = await _json_body(request, self.bodies)
        return json_response((await self.ask(request, header))["settings"])

    # ------------------------------------------------------------------ inference
    async def infer(self, request: web.Request) -> web.StreamResponse:
        received = time.monotonic_ns()  # HTTP_RECV_START, for a trace
        info = _model(request)
        model, version = info["model_name"], info["model_version"]
        call, frames, slot = await receive(request, self.bodies, self.inputs, model, version)
        call.header[trace_stamps.FIELD] = trace_stamps.received(
            "HTTP", received, time.monotonic_ns()
        )
        caller = self.callers.of_http(request)
        answered = None if slot is None else functools.partial(self.inputs.free, slot)
        async with self.channel.infer(caller, call.header, frames, answered) as (reply, tensors):
            tensors = await self.labels.apply(caller, reply, tensors, call.classes)
            traced = trace_stamps.trace_id(reply)
            if traced:
                return await self._traced(request, caller, traced, call, reply, tensors)
            return await self._respond(request, call, reply, tensors)

    async def _traced(
        self,
        request: web.Request,
        caller: bytes,
        traced: int,
        call: Any,
        reply: dict[str, Any],
        frames: list[Any],
    ) -> web.StreamResponse:
        """A traced request's answer, written here to stamp its end (HTTP_SEND_END)."""
        start = time.monotonic_ns()
        response = await self._respond(request, call, reply, frames)
        if not response.prepared:
            await response.prepare(request)
            await response.write_eof()
        self.channel.notify(caller, trace_stamps.sent("HTTP", traced, start, time.monotonic_ns()))
        return response

    async def _respond(
        self, request: web.Request, call: Any, reply: dict[str, Any], frames: list[Any]
    ) -> web.StreamResponse:
        head, binaries = response_body(call, reply, frames)
        if not binaries:
            return web.Response(body=head, content_type=JSON)
        size = sum(len(b) for b in binaries)
        headers = {HEADER_LENGTH: str(len(head))}
        if size < STREAM_MIN:  # one write: headers, JSON and tensors joined
            body = b"".join([head, *binaries])
            return web.Response(body=body, content_type=BINARY, headers=headers)
        # large tensors go to the socket from where they lie (the worker's output region)
        return await stream(request, head, binaries, headers)

    # ------------------------------------------------------------------ repository
    async def repository_index(self, request: web.Request) -> web.Response:
        ready = (await _json_body(request, self.bodies)).get("ready", False)
        if not isinstance(ready, bool):
            raise invalid_arg("Invalid value for 'ready': expected a boolean")
        reply = await self.ask(request, {"type": "repository_index", "ready": ready})
        return json_response(reply["models"])

    async def model_control(self, request: web.Request) -> web.Response:
        model, action = request.match_info["model"], request.match_info["action"]
        if action == "unload":
            await self.ask(request, {"type": "unload", "model_name": model})
            return web.Response(content_type=JSON)
        params = (await _json_body(request, self.bodies, 0)).get("parameters") or {}
        if not isinstance(params, dict):
            raise invalid_arg("load 'parameters' must be an object")
        header, frames = load_message(model, params, decode_files=True)
        await self.ask(request, header, frames)
        return web.Response(content_type=JSON)

    async def named_repository(self, request: web.Request) -> web.Response:
        raise InferpoolError(Code.UNSUPPORTED, "'repository_name' specification is not supported")

    # ------------------------------------------------------------------ shared memory
    async def shm_status(self, request: web.Request) -> web.Response:
        header = {"type": f"{_kind(request)}_shared_memory_status"}
        if "region" in request.match_info:
            header["name"] = request.match_info["region"]
        return json_response((await self.ask(request, header))["regions"])

    async def register(self, request: web.Request) -> web.Response:
        body = await _json_body(request, self.bodies)
        header: dict[str, Any] = {
            "type": f"register_{_kind(request)}_shared_memory",
            "name": request.match_info["region"],
            "byte_size": body.get("byte_size"),
        }
        if _kind(request) == "cuda":
            handle = body.get("raw_handle")
            header["raw_handle"] = handle.get("b64") if isinstance(handle, dict) else None
            header["device_id"] = body.get("device_id")
        else:
            header["key"] = body.get("key")
            header["offset"] = body.get("offset", 0)
        await self.ask(request, header)
        return web.Response(content_type=JSON)

    async def shm_unregister(self, request: web.Request) -> web.Response:
        header = {"type": f"unregister_{_kind(request)}_shared_memory"}
        if "region" in request.match_info:
            header["name"] = request.match_info["region"]
        await self.ask(request, header)
        return web.Response(content_type=JSON)
