"""Health over HTTP: Triton's routes and the per-node contract of an orchestrated node.

Triton's: ``/v2/health/live``, ``/v2/health/ready`` and
``/v2/models/{model}[/versions/{version}]/ready`` (200 when live / ready, 400 when not, empty
bodies; a model that is not ready says ``Model version not ready``).  The node's, for
Kubernetes probes, load balancers and the Ray Serve adapter: ``/livez`` and ``/readyz`` (200
``ok``, or 503 with the reason as text) and ``POST /drain`` (the drain a SIGTERM starts;
answered at once with ``{"draining": true, "reason", "inflight"}``).

The HTTP frontend serves these routes among its others; ``--health-port`` serves them alone,
for probes when the KServe frontends are off (or must not be exposed).  Each answer comes
from the broker's loop through the channel, as a zmq client's ``health_live`` /
``health_ready`` would, so a loop that does not answer within ``HEALTH_TIMEOUT_S`` (stuck)
is reported with 503 rather than guessed: that is the one way ``/livez`` fails.  Readiness
is the broker's (``broker.front.readiness``): not while loading, draining, or while a model
that should serve has no live instance.  New probes are new routes in :func:`routes`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from inferpool.broker.kserve.broker_channel import BrokerChannel
from inferpool.broker.kserve.callers import Callers
from inferpool.broker.kserve.http_base import error_response, json_response
from inferpool.wire.errors import Code, InferpoolError

HEALTH_TIMEOUT_S = 5.0
_MODEL = "/v2/models/{model}"
_VERSION = "/versions/{version:[0-9]+}"


def routes(channel: BrokerChannel, callers: Callers) -> list[web.RouteDef]:
    """The health routes (live, ready, a model's readiness) on their own."""

    async def call(request: web.Request, header: dict[str, Any]) -> dict[str, Any]:
        caller = callers.of_http(request)
        reply, _ = await channel.call(caller, header, timeout=HEALTH_TIMEOUT_S)
        return reply

    async def ask(request: web.Request, header: dict[str, Any], field: str) -> bool:
        return bool((await call(request, header)).get(field))

    async def live(request: web.Request) -> web.Response:
        live = await ask(request, {"type": "health_live"}, "live")
        return web.Response(status=200 if live else 400)

    async def ready(request: web.Request) -> web.Response:
        ready = await ask(request, {"type": "health_ready"}, "ready")
        return web.Response(status=200 if ready else 400)

    async def livez(request: web.Request) -> web.Response:
        await ask(request, {"type": "health_live"}, "live")  # a stuck loop: UNAVAILABLE, 503
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        reply = await call(request, {"type": "health_ready"})
        if reply.get("ready"):
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"not ready: {reply.get('reason', '')}\n")

    async def drain(request: web.Request) -> web.Response:
        reply = await call(request, {"type": "drain"})
        return json_response({k: reply[k] for k in ("draining", "reason", "inflight")})

    async def model_ready(request: web.Request) -> web.Response:
        info = request.match_info
        header = {
            "type": "model_ready",
            "model_name": info["model"],
            "model_version": info.get("version", ""),
        }
        try:
            ok = await ask(request, header, "ready")
        except InferpoolError as err:
            if err.code is not Code.NOT_FOUND:  # Triton: an unknown model is not ready
                raise
            ok = False
        return web.Response() if ok else error_response(400, "Model version not ready")

    return [
        web.get("/livez", livez, allow_head=False),
        web.get("/readyz", readyz, allow_head=False),
        web.post("/drain", drain),
        web.get("/v2/health/live", live, allow_head=False),
        web.get("/v2/health/ready", ready, allow_head=False),
        web.get(_MODEL + "/ready", model_ready, allow_head=False),
        web.get(_MODEL + _VERSION + "/ready", model_ready, allow_head=False),
    ]
