"""A KServe load request's parameters as the broker's ``load`` message carries them.

Triton's load API takes a ``config`` override (ModelConfig as JSON) and ``file:<path>``
overrides (the model directory's files: base64 text over HTTP, ``bytes_param`` over gRPC).
The zmq ``load`` message carries each file as a tensor frame named by its index in
``parameters`` (docs/PROTOCOL.md), so both frontends translate to that; the broker checks
the rest with Triton's messages, as it does for a zmq client.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from inferpool.wire.errors import invalid_arg

FILE_PREFIX = "file:"


def load_message(
    model: str, parameters: Mapping[str, Any], decode_files: bool
) -> tuple[dict[str, Any], list[bytes]]:
    """The ``load`` header and its frames; ``decode_files``: file values are base64 text."""
    params: dict[str, Any] = {}
    frames: list[bytes] = []
    for key, value in parameters.items():
        if key.startswith(FILE_PREFIX):
            params[key] = len(frames)
            frames.append(_file_bytes(key, value, decode_files))
        else:
            params[key] = value
    header: dict[str, Any] = {"type": "load", "model_name": model}
    if params:
        header["parameters"] = params
    return header, frames


def _file_bytes(key: str, value: Any, decode: bool) -> bytes:
    if decode:
        if not isinstance(value, str):
            raise invalid_arg(f"File parameter '{key}' must be base64 text")
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise invalid_arg(f"File parameter '{key}' is not valid base64") from None
    if not isinstance(value, bytes):
        raise invalid_arg(f"File parameter '{key}' must have bytes type for its value")
    return value
