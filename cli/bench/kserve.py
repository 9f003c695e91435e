"""``--transport http`` and ``grpc``: the benchmark's requests through the server's KServe v2
frontends with tritonclient's asyncio clients, as perf_analyzer sends them to Triton.

They answer at ``--url`` (Triton's ports by default: HTTP 8000, gRPC 8001); the statistics
of the window still come from the zmq endpoint.  KServe answers a request once, so a
decoupled model is refused up front.  tritonclient's errors become InferpoolErrors (the
runner counts them); a server that does not answer at all is one line before any level.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, ClassVar

import aiohttp
from tritonclient.grpc import aio as grpc_aio
from tritonclient.http import aio as http_aio
from tritonclient.utils import InferenceServerException

from inferpool.bench.transports import Sender, Transport, register
from inferpool.usage import UsageError
from inferpool.wire.errors import Code, InferpoolError

# an HTTP status or a gRPC status code, as tritonclient gives them, to the code it means
_CODES = {
    "400": Code.INVALID_ARG,
    "404": Code.NOT_FOUND,
    "503": Code.UNAVAILABLE,
    "StatusCode.INVALID_ARGUMENT": Code.INVALID_ARG,
    "StatusCode.NOT_FOUND": Code.NOT_FOUND,
    "StatusCode.UNAVAILABLE": Code.UNAVAILABLE,
    "StatusCode.DEADLINE_EXCEEDED": Code.TIMEOUT,
}


def _error(exc: Exception, where: str) -> InferpoolError:
    if isinstance(exc, InferenceServerException):
        return InferpoolError(_CODES.get(str(exc.status()), Code.INTERNAL), exc.message())
    return InferpoolError(Code.UNAVAILABLE, f"{where}: {exc}")


class KServeTransport(Transport):
    """What the HTTP and gRPC transports share: the URL, the check that the server answers,
    and one sender per slot with its request's inputs built once."""

    protocol: ClassVar[str]
    default_port: ClassVar[int]
    client: Any

    @abstractmethod
    def _open_client(self, url: str) -> Any: ...

    @abstractmethod
    def _infer_input(self, name: str, shape: list[int], datatype: str) -> Any: ...

    async def open(self) -> None:
        if self.workload.decoupled:
            raise UsageError(
                f"--transport {self.name} sends to models that answer once: use zmq to stream"
            )
        self.address = self.url or f"localhost:{self.default_port}"
        self.client = self._open_client(self.address)
        where = f"no KServe {self.protocol} server answers at {self.address}"
        try:
            live = await self.client.is_server_live()
        except (InferenceServerException, aiohttp.ClientError, OSError) as exc:
            await self.close()
            raise _error(exc, where) from None
        if not live:
            await self.close()
            raise InferpoolError(Code.UNAVAILABLE, f"{where} (is it served: --{self.name}-port?)")

    async def sender(self) -> Sender:
        w, client = self.workload, self.client
        inputs = []
        for name, value in w.inputs.items():
            tensor = self._infer_input(name, list(value.shape), w.datatypes[name])
            tensor.set_data_from_numpy(value, **self._data_options)
            inputs.append(tensor)

        async def infer() -> None:
            try:
                await client.infer(w.model, inputs, model_version=w.version)
            except (InferenceServerException, aiohttp.ClientError, OSError) as exc:
                raise _error(exc, self.address) from None

        return infer

    @property
    def _data_options(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        await self.client.close()


@register
class HttpTransport(KServeTransport):
    """Sends over KServe HTTP/REST with Triton's asyncio client."""

    name = "http"
    protocol = "HTTP"
    default_port = 8000

    def _open_client(self, url: str) -> Any:
        return http_aio.InferenceServerClient(url, conn_limit=max(self.slots, 1))

    def _infer_input(self, name: str, shape: list[int], datatype: str) -> Any:
        return http_aio.InferInput(name, shape, datatype)

    @property
    def _data_options(self) -> dict[str, Any]:
        return {"binary_data": True}


@register
class GrpcTransport(KServeTransport):
    """Sends over KServe gRPC with Triton's asyncio client."""

    name = "grpc"
    protocol = "gRPC"
    default_port = 8001

    def _open_client(self, url: str) -> Any:
        return grpc_aio.InferenceServerClient(url)

    def _infer_input(self, name: str, shape: list[int], datatype: str) -> Any:
        return grpc_aio.InferInput(name, shape, datatype)
