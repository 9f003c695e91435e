"""inferpool clients: the zmq client, the shared-memory clients (sync and asyncio), and the
wire codec they share.

Imports are lazy, so ``from client.errors import ...`` stays light (workers import it
before pinning, when numpy and zmq must not be loaded yet).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncClient": "client.aio",
    "Client": "client.sync",
    "InferResult": "client.sync",
    "default_endpoint": "client.sync",
    "ShmClient": "client.shm",
    "AsyncShmClient": "client.shm_async",
    "ShmRequest": "client.shm_core",
    "ShmResult": "client.shm_core",
    "Code": "client.errors",
    "InferpoolError": "client.errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
