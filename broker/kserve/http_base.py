"""What every HTTP listener of the frontends shares: Triton's JSON errors and the app.

Triton answers a failed call with ``{"error": "<message>"}`` and the status its code maps to
(``kserve.status``); an unknown path is 404 ``Not Found`` and a wrong method 405 ``Method Not
Allowed``, both as JSON too.  A bug in a handler is a 500 with the reason, never a dropped
connection.  At a verbose log level (``--log-verbose``) each error answered is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable

import orjson
from aiohttp import web

from inferpool.broker.kserve.status import HTTP_STATUS
from inferpool.wire.errors import InferpoolError

log = logging.getLogger("inferpool.kserve")
JSON = "application/json"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_response(body: object, status: int = 200) -> web.Response:
    """A JSON response with ``status``."""
    return web.Response(body=orjson.dumps(body), status=status, content_type=JSON)


def error_response(status: int, message: str) -> web.Response:
    """Triton's error body: ``{"error": message}``."""
    return json_response({"error": message}, status)


@web.middleware
async def triton_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer errors as Triton's HTTP frontend does: a status and ``{"error": ...}``."""
    try:
        return await handler(request)
    except InferpoolError as err:
        return _failed(request, HTTP_STATUS[err.code], err.message)
    except web.HTTPException as exc:  # aiohttp's own: no route, wrong method, body too large
        if exc.status < 400:
            raise
        detail = exc.text if exc.status not in (404, 405) and exc.text else exc.reason
        return _failed(request, exc.status, detail or exc.reason)
    except Exception as exc:
        log.exception("HTTP %s %s failed", request.method, request.path)
        return error_response(500, f"{type(exc).__name__}: {exc}")


def _failed(request: web.Request, status: int, message: str) -> web.Response:
    log.debug("HTTP %s %s: %d %s", request.method, request.path, status, message)
    return error_response(status, message)


def application(routes: Iterable[web.RouteDef], client_max_size: int) -> web.Application:
    """An app serving ``routes`` with Triton's errors; bodies up to ``client_max_size``."""
    app = web.Application(middlewares=[triton_errors], client_max_size=client_max_size)
    app.add_routes(routes)
    return app
