"""inferpool clients: the zmq clients and the shared-memory clients, each sync and asyncio,
thin wrappers that do the I/O of one protocol core (client.core, client.shm_core).

Imports are lazy, so ``import inferpool.client`` stays light until a name is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncClient": "inferpool.client.aio",
    "Client": "inferpool.client.sync",
    "InferResult": "inferpool.client.core",
    "default_endpoint": "inferpool.wire.paths",
    "ShmClient": "inferpool.client.shm",
    "AsyncShmClient": "inferpool.client.shm_async",
    "ShmRequest": "inferpool.client.shm_request",
    "ShmResult": "inferpool.client.shm_request",
    "Code": "inferpool.wire.errors",
    "InferpoolError": "inferpool.wire.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
