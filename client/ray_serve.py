"""Ray Serve in front of inferpool: one replica per node, each forwarding to its node's broker.

``pip install 'inferpool[ray]'``.  The broker stays the node's own service (a systemd unit, a
pod): never a child of a Ray worker, so Ray restarting a replica never restarts a broker or
drops its loaded models.  Each node that runs a broker advertises one unit of the custom
resource ``inferpool`` (``ray start --resources '{"inferpool": 1}'``) and each replica asks for
one, so replicas land only where a broker is, one per node.

A replica forwards requests over the node's ipc endpoint with the asyncio client, each with its
own timeout.  Serve's health check (``check_health``) asks the broker's ``/readyz``: a node
whose broker is loading, draining or gone fails it, Serve stops routing there and replaces the
replica, and the replacement waits in its constructor until the broker is ready again, so it
takes no request before.  A broker that does not answer at all is gone: the requests waiting on
it are answered UNAVAILABLE at once, as are new ones until it is back, rather than each waiting
out its timeout.  A drain with ``--drain-delay`` above Serve's detection time (3 failed
checks, ``health_check_period_s`` apart) loses no request: SIGTERM on the node, or
:func:`drain_node` from anywhere in the cluster, which runs a Ray task on the node that sends
the ``drain`` message over the node's own ipc endpoint, as the user Ray runs as there (the
broker takes a drain only from its own user or root: a ``POST /drain`` from another host is
refused).

Callers use a DeploymentHandle (``await handle.infer.remote(model, {"INPUT0": array})``,
numpy in and out) or HTTP through Serve's proxy: ``POST <route>/v2/models/<model>/infer`` with
a KServe v2 JSON body (inputs with ``data``), answered with KServe v2 JSON outputs; an error
keeps the broker's message, with Triton's HTTP status.  docs/scale-out.md shows the setup.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from typing import Any

import aiohttp
import numpy as np
from ray import serve
from ray.serve.deployment import Application
from starlette.requests import Request
from starlette.responses import JSONResponse

from inferpool.client import kserve_json
from inferpool.client.aio import AsyncClient
from inferpool.client.sync import Client
from inferpool.wire.errors import HTTP_STATUS, Code, InferpoolError

log = logging.getLogger("inferpool.ray_serve")
RESOURCE = "inferpool"  # one unit on each node that runs a broker
HEALTH_URL_ENV = "INFERPOOL_HEALTH_URL"  # the node's /readyz (default: DEFAULT_HEALTH_URL)
DEFAULT_HEALTH_URL = "http://127.0.0.1:8003/readyz"
HEALTH_TIMEOUT_S = 5.0
READY_POLL_S = 0.25
_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([0-9]+))?/infer")


class InferpoolNode:
    """One replica: its node's broker, reached at ``endpoint`` (default: $INFERPOOL_ENDPOINT,
    else the default ipc endpoint), its readiness at ``health_url`` (default:
    $INFERPOOL_HEALTH_URL, else ``DEFAULT_HEALTH_URL``); ``timeout``: each request's default."""

    async def __init__(  # type: ignore[misc]  # Ray actors may construct asynchronously
        self, endpoint: str | None = None, health_url: str | None = None, timeout: float = 30.0
    ) -> None:
        self.health_url = health_url or os.environ.get(HEALTH_URL_ENV) or DEFAULT_HEALTH_URL
        self.timeout = timeout
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S))
        self._pending: set[asyncio.Future[dict[str, np.ndarray]]] = set()
        self._gone = ""  # why the broker is gone (it did not answer its health port)
        while (why := await self._not_ready()) is not None:  # no traffic before the broker is
            log.info("waiting for the node's broker: %s", why)
            await asyncio.sleep(READY_POLL_S)
        self.client = AsyncClient(endpoint, timeout=timeout)

    async def _not_ready(self) -> str | None:
        """None when the broker says ready; otherwise why not, in its words.  Notes whether
        the broker is gone, and cancels what waits on it then."""
        try:
            async with self._http.get(self.health_url) as resp:
                self._gone = ""
                if resp.status == 200:
                    return None
                return f"{self.health_url}: {resp.status} {(await resp.text()).strip()}"
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self._gone = f"{self.health_url}: {exc or type(exc).__name__}"
            for request in self._pending:
                request.cancel()
            return self._gone

    async def check_health(self) -> None:
        """Serve's health check: the broker's readiness."""
        why = await self._not_ready()
        if why is not None:
            raise RuntimeError(f"the node's broker is not ready ({why})")

    async def infer(
        self,
        model: str,
        inputs: dict[str, Any],
        outputs: list[str] | None = None,
        *,
        version: str = "",
        timeout: float | None = None,
    ) -> dict[str, np.ndarray]:
        """One inference on this node's broker (numpy in and out); InferpoolError on failure."""
        if not self._gone:
            request = asyncio.ensure_future(
                self.client.infer(
                    model, inputs, outputs, version=version, timeout=timeout or self.timeout
                )
            )
            self._pending.add(request)
            try:
                return await request
            except asyncio.CancelledError:
                if not self._gone or not request.cancelled():
                    raise  # the caller's cancellation, not the broker's
            finally:
                self._pending.discard(request)
        raise InferpoolError(
            Code.UNAVAILABLE, f"the node's broker is gone ({self._gone}): retry on another node"
        )

    async def __call__(self, request: Request) -> JSONResponse:
        """HTTP through Serve's proxy: KServe v2 JSON in and out."""
        match = _INFER_PATH.search(request.url.path)
        if request.method != "POST" or match is None:
            return _error(404, "POST <route>/v2/models/<model>[/versions/<n>]/infer")
        try:
            body = await request.json()
            inputs = {spec["name"]: kserve_json.array(spec) for spec in body["inputs"]}
            wanted = [o["name"] for o in body.get("outputs", [])] or None
            out = await self.infer(match[1], inputs, wanted, version=match[2] or "")
        except InferpoolError as err:
            return _error(HTTP_STATUS[err.code], err.message)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"a KServe v2 JSON body was expected: {exc!r}")
        outputs = [kserve_json.output(name, arr) for name, arr in out.items()]
        return JSONResponse({"model_name": match[1], "outputs": outputs})


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def drain_node(address: str, *, timeout: float = 60.0) -> dict[str, Any]:
    """Drain the broker of the live Ray node at ``address`` (its IP, as Ray knows it): the
    broker's answer (``draining``, ``reason``, ``inflight``).  Call it from a Ray driver
    (``ray.init(address=...)``); NOT_FOUND if no live node has that address."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node = next((n for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == address), None)
    if node is None:
        raise InferpoolError(Code.NOT_FOUND, f"no live Ray node has the address {address}")
    here = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
    task = ray.remote(num_cpus=0, max_retries=0)(_drain_here).options(scheduling_strategy=here)
    answer: dict[str, Any] = ray.get(task.remote(), timeout=timeout)
    return answer


def _drain_here() -> dict[str, Any]:
    """On the node: the drain message over its ipc endpoint ($INFERPOOL_ENDPOINT, as the
    replicas use)."""
    with Client(timeout=HEALTH_TIMEOUT_S) as client:
        return client.drain()


def node_deployment(
    nodes: int,
    *,
    endpoint: str | None = None,
    health_url: str | None = None,
    timeout: float = 30.0,
    health_check_period_s: float = 2.0,
    max_ongoing_requests: int = 256,
) -> Application:
    """The application: ``nodes`` replicas (one per node advertising ``inferpool``)."""
    deployment = serve.deployment(
        name="inferpool",
        num_replicas=nodes,
        ray_actor_options={"num_cpus": 0, "resources": {RESOURCE: 1}},
        health_check_period_s=health_check_period_s,
        health_check_timeout_s=HEALTH_TIMEOUT_S * 2,
        max_ongoing_requests=max_ongoing_requests,
    )(InferpoolNode)
    return deployment.bind(endpoint, health_url, timeout)
