"""The worker's reader of its channel: ``decode_from_broker`` that remembers the last batch.

The broker sends a stream of like batches: the same model's requests with their inputs in
the same places (a client's region, a slot of the arena used again), the same outputs
wanted, and the slot the last answer took given back.  Such a record is decoded once: a
work item whose inputs (or wanted outputs, or an Execute whose slots to free) are equal to
the last one's, as JSON decoded them, gets the very records decoded then.  The records are
equal to what decoding them afresh would give (JSON's values compare equal only as the same
numbers, strings, lists and nulls; ``true`` equals ``1`` and ``1.0``, but the broker writes
offsets, sizes and dims as integers only, and the records decoded first keep theirs), and
they are never changed once made, so sharing them is sharing values.  The worker keys its
request plans on these objects (workers/request_plans.py): a repeated record reaches it as
the same object, checked with ``is``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from inferpool.wire.worker.messages import (
    FROM_BROKER,
    BrokerMessage,
    Execute,
    Kind,
    Slot,
    TensorRef,
    WantedOutput,
    Work,
    _new,
    _ref,
    _slot,
    _wanted,
    decode,
)


class BrokerReader:
    """Decodes the broker's messages (as ``decode_from_broker``), a repeated record to the
    records its first decoding made."""

    __slots__ = ("_free", "_inputs", "_outputs", "decode")

    def __init__(self) -> None:
        # each: (the raw JSON value last decoded, the records made of it)
        self._inputs: tuple[Any, list[TensorRef]] = (None, [])
        self._outputs: tuple[Any, list[WantedOutput]] = (None, [])
        self._free: tuple[Any, list[Slot]] = (None, [])
        table: dict[str, Callable[[Any], Any]] = {**FROM_BROKER, Kind.EXECUTE: self._execute}
        #: a message the broker sent; INTERNAL if it is not one
        self.decode: Callable[[bytes | memoryview], BrokerMessage] = partial(
            decode, table, "broker"
        )

    def _execute(self, body: Any) -> Execute:
        requests, free, unmap, release, nulls = body
        if free:
            last = self._free
            if free != last[0]:
                self._free = last = (free, list(map(_slot, free)))
            free = last[1]
        return _new(Execute, ([*map(self._work, requests)], free, unmap, release, nulls))

    def _work(self, raw: Any) -> Work:
        rid, id_, correlation_id, flags, parameters, inputs, outputs, priority, timeout = raw
        last = self._inputs
        if inputs != last[0]:
            self._inputs = last = (inputs, list(map(_ref, inputs)))
        wanted = self._outputs
        if outputs != wanted[0]:
            self._outputs = wanted = (outputs, list(map(_wanted, outputs)))
        inputs, outputs = last[1], wanted[1]
        fields = (rid, id_, correlation_id, flags, parameters, inputs, outputs, priority, timeout)
        return _new(Work, fields)
