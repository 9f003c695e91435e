"""inferpool clients: the zmq client, the shared-memory clients (sync and asyncio), and the
wire codec they share.

Imports are lazy, so ``from client.errors import ...`` stays light (workers import it
before pinning, when numpy and zmq must not be loaded yet).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncClient": "inferpool.client.aio",
    "Client": "inferpool.client.sync",
    "InferResult": "inferpool.client.sync",
    "default_endpoint": "inferpool.wire.paths",
    "ShmClient": "inferpool.client.shm",
    "AsyncShmClient": "inferpool.client.shm_async",
    "ShmRequest": "inferpool.client.shm_core",
    "ShmResult": "inferpool.client.shm_core",
    "Code": "inferpool.wire.errors",
    "InferpoolError": "inferpool.wire.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
