"""The header of an inference response, and its template per model version.

A model answers request after request with the same outputs (names, datatypes, shapes):
only the ``id`` changes.  So the header of such a response is encoded once, in full, and
kept on the model version as a template; the next response with the same outputs is the
template with its own ``id`` spliced in (the bytes the full encoding would give).

Why a template cannot give a response another's header: what a header holds besides its
``id`` is the model version's name and version (fixed for the object the template is kept
on) and the outputs' names, datatypes and shapes, which are compared with the template's
before it is used (an int and a float of one value would compare equal; shapes are ints);
a response with parameters (a backend's, a decoupled model's final flag) or with outputs
left in shared memory (``front.handles`` describes them) is encoded in full every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from inferpool.broker.models.registry import ModelVersion
from inferpool.wire.codec import encode_header
from inferpool.wire.worker.protocol import TensorRef

_HEAD = b'{"type":"infer","id":'  # the start of every response header: its id follows


def response_header(
    model: ModelVersion, client_id: Any, outputs: list[dict[str, Any]], params: dict[str, Any]
) -> dict[str, Any]:
    """An inference response's header: ``outputs`` described, with ``params``."""
    return {
        "type": "infer",
        "id": client_id,
        "model_name": model.name,
        "model_version": model.version_str,
        "outputs": outputs,
        "parameters": params,
    }


def described(out: TensorRef) -> dict[str, Any]:
    """An output sent as a frame, as its response header describes it."""
    return {"name": out.name, "datatype": out.datatype, "shape": out.shape}


class HeaderTemplate:
    """The last plain response header of one model version, less its ``id``."""

    __slots__ = ("key", "tail")

    def __init__(self, key: list[tuple[str, str, Sequence[int]]], tail: bytes) -> None:
        self.key = key  # (name, datatype, shape) of each output, in order
        self.tail = tail  # the header's bytes after its id


def plain_header(model: ModelVersion, client_id: str | int, outputs: Sequence[TensorRef]) -> bytes:
    """The header of a response of ``model`` with ``outputs`` as frames and no parameters:
    the model's template with ``client_id`` in it, the template made anew when the outputs
    differ from its own."""
    key = []
    for out in outputs:
        key.append((out.name, out.datatype, out.shape))
    template = model.header_template
    if template is None or template.key != key:
        full = encode_header(response_header(model, 0, [described(o) for o in outputs], {}))
        template = model.header_template = HeaderTemplate(key, full[len(_HEAD) + 1 :])
    return _HEAD + orjson.dumps(client_id) + template.tail
