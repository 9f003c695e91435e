"""Control messages (docs/PROTOCOL.md), described once for the sync and the asyncio client.

Each function returns a :class:`Call`: the message to send and how to read its answer.  The
clients only differ in how they wait, so ``Client.is_model_ready`` and
``AsyncClient.is_model_ready`` are one line each over the same Call.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from inferpool.wire.errors import invalid_arg

T = TypeVar("T")
Header = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """A control message and how its answer is read."""

    type: str
    read: Callable[[Header], T]
    fields: dict[str, Any] = field(default_factory=dict)
    frames: tuple[bytes, ...] = ()  # bytes the message carries (a load's override files)


def _versioned(model: str, version: str | int) -> dict[str, Any]:
    return {"model_name": model, "model_version": str(version)}


def live() -> Call[bool]:
    """Whether the server is live."""
    return Call("health_live", lambda h: bool(h.get("live")))


def ready() -> Call[bool]:
    """Whether the server is ready."""
    return Call("health_ready", lambda h: bool(h.get("ready")))


def model_ready(model: str, version: str | int = "") -> Call[bool]:
    """Whether ``model`` (``version``: a given one) is ready."""
    return Call("model_ready", lambda h: bool(h.get("ready")), _versioned(model, version))


def server_metadata() -> Call[Header]:
    """The server's name, version and extensions."""
    return Call("server_metadata", lambda h: h)


def model_metadata(model: str, version: str | int = "") -> Call[Header]:
    """A model's versions, platform, inputs and outputs."""
    return Call("model_metadata", lambda h: h, _versioned(model, version))


def model_config(model: str, version: str | int = "") -> Call[Header]:
    """A model's config, as Triton's JSON."""
    return Call("model_config", lambda h: dict(h["config"]), _versioned(model, version))


def models(ready_only: bool = False) -> Call[list[Header]]:
    """The repository index (``ready_only``: the ready models only)."""
    return Call("repository_index", lambda h: list(h["models"]), {"ready": ready_only})


def load(
    model: str,
    config: str | Mapping[str, Any] | None = None,
    files: Mapping[str, bytes] | None = None,
) -> Call[None]:
    """Load ``model``; as Triton's client, ``config`` (JSON, or a dict) replaces its
    config.pbtxt and ``files`` ("file:<version>/<name>" -> bytes) its directory."""
    fields: dict[str, Any] = {"model_name": model}
    params: dict[str, Any] = {}
    if config is not None:
        params["config"] = config if isinstance(config, str) else json.dumps(config)
    frames: list[bytes] = []
    for key, data in (files or {}).items():
        if not key.startswith("file:"):
            raise invalid_arg(f"override file names start with 'file:', got {key!r}")
        params[key] = len(frames)  # the frame that carries it
        frames.append(bytes(data))
    if params:
        fields["parameters"] = params
    return Call("load", lambda h: None, fields, tuple(frames))


def unload(model: str) -> Call[None]:
    """Unload ``model``."""
    return Call("unload", lambda h: None, {"model_name": model})


def drain() -> Call[Header]:
    """Drain the server (as SIGTERM): ``draining``, ``reason``, ``inflight``."""
    return Call("drain", lambda h: {k: h[k] for k in ("draining", "reason", "inflight")})


def statistics(model: str = "", version: str | int = "") -> Call[Header]:
    """Inference statistics, of every model or of one."""
    return Call("statistics", lambda h: h, _versioned(model, version))


def status() -> Call[list[Header]]:
    """Every instance's worker: its state, pid, pinning and last error."""
    return Call("status", lambda h: list(h["instances"]))
