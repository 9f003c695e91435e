"""Response plans: an infer response read without decoding its header, where its header's
bytes equal a recent response's apart from the id.

A model answers a request of one signature with the same header every time but for its
``id`` (the outputs' names, datatypes and shapes, the model's version, its parameters), so
the client keeps what decoding such a header found (a plan) under its bytes with the id cut
out, and reads the next such response from the plan: no JSON decoding, no walk over the
outputs' descriptions.  Why a plan cannot serve stale or foreign data:

- it is found only by bytes: the header before the id and the header after it must equal
  the plan's byte for byte, and the id between them must be ASCII digits (the ids this
  client gives), so the header decodes to the plan's, the id apart, whatever the response
  is (an error, other parameters, another shape: other bytes, no plan);
- those bytes lie inside one JSON string (a quote on each side, digits between: nothing
  else parses), so changing them changes that string's value and nothing else; a plan is
  used only once a second response with another id has decoded to the first one's header
  with just ``id`` changed, which proves that string is the header's ``id``;
- it holds only what the user cannot reach: each planned header gets its own copy of the
  parameters (flat values only), and the arrays are made anew over the new frames, whose
  sizes are checked (any mismatch is left to the decoding path, which says what is wrong).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import zmq

from inferpool.wire import codec

PLANS = 64  # response plans (and candidates) a client keeps; all dropped when full,
UNPLANNED = 16 * PLANS  # and this many infer responses decoded before it learns again
LONGEST = 4096  # bytes of a header worth a plan (a plan keeps them)
_SCALARS = (str, int, float, bool, type(None))
Key = tuple[bytes, bytes]  # a header's bytes before and after its id's digits


def split_id(raw: bytes) -> tuple[Key, bytes] | None:
    """The bytes around the first ``"id":"<digits>"`` in a header, and its digits."""
    start = raw.find(b'"id":"') + 6
    end = raw.find(b'"', start)
    digits = raw[start:end]
    if start > 5 and end > 0 and digits.isdigit() and len(raw) <= LONGEST:
        return (raw[:start], raw[end:]), digits
    return None


class PlannedHeader(dict[str, Any]):
    """A response header equal to what decoding its bytes gives, made from ``plan``."""

    __slots__ = ("plan",)
    plan: ResponsePlan


class ResponsePlan:
    """What a response header decoded to, for the next ones with the same bytes: learnt
    from the first response (a candidate), used once a second confirms it."""

    __slots__ = ("digits", "header", "outputs", "usable")

    def __init__(self, header: dict[str, Any], digits: bytes) -> None:
        self.header = header  # the first response's, until confirmed (then a private copy)
        self.digits = digits  # the first response's id
        self.outputs: list[tuple[str, np.dtype[Any], tuple[int, ...], int]] = []
        self.usable = False

    def confirm(self, header: dict[str, Any], digits: bytes) -> None:
        """Use the plan from now on if ``header`` (a second response with these bytes,
        decoded, its id ``digits``) is the first one's with only the id changed (see the
        module's docstring) and its outputs can be planned; asked once."""
        first, self.header = self.header, {}
        if not first or digits == self.digits or header != {**first, "id": digits.decode()}:
            return
        params, specs = header.get("parameters"), header.get("outputs") or []
        if "error" in header or type(specs) is not list:
            return
        if params is not None and not (
            type(params) is dict and all(type(v) in _SCALARS for v in params.values())
        ):
            return  # nested values: the user's copy would share them
        outputs = [d for d in map(_described, specs) if d is not None]
        if len(outputs) != len(specs) or type(header.get("model_name", "")) is not str:
            return
        own = dict(header)
        if params is not None:
            own["parameters"] = dict(params)
        self.header, self.outputs, self.usable = own, outputs, True

    def header_for(self, request_id: str) -> PlannedHeader:
        """The header of the response with id ``request_id`` (its own parameters)."""
        header = PlannedHeader(self.header)
        header["id"] = request_id
        params = header.get("parameters")
        if params is not None:
            header["parameters"] = dict(params)
        header.plan = self
        return header

    def arrays(self, frames: list[Any]) -> dict[str, np.ndarray] | None:
        """The outputs over ``frames``; None unless each frame holds its output's bytes."""
        if len(frames) != len(self.outputs):
            return None
        outputs: dict[str, np.ndarray] = {}
        for (name, dtype, shape, nbytes), frame in zip(self.outputs, frames, strict=True):
            buf = frame.buffer if type(frame) is zmq.Frame else memoryview(frame)
            if buf.nbytes != nbytes:
                return None
            outputs[name] = np.ndarray(shape, dtype, buf)
        return outputs


def _described(spec: Any) -> tuple[str, np.dtype[Any], tuple[int, ...], int] | None:
    """An output's name, dtype, shape and byte size, if it comes in a frame of fixed-size
    elements; None otherwise."""
    if type(spec) is not dict or spec.get("parameters") or type(spec.get("name")) is not str:
        return None
    datatype, shape = spec.get("datatype"), spec.get("shape")
    if type(datatype) is not str or datatype not in codec.DATATYPES or datatype == "BYTES":
        return None
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):
        return None
    dtype = codec.numpy_dtype(datatype)
    return spec["name"], dtype, tuple(shape), dtype.itemsize * codec.element_count(shape)
