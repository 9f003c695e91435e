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
request plans on these objects (workers/work_items.py): a repeated record reaches it as
the same object, checked with ``is``.

A batch of one request like the last batch of one is not even parsed: when its bytes after
the request's handle and id are the last such batch's bytes after them (its head is then
``["execute",[[[<rid>,<id>,``, checked as JSON), it is the last one's Execute with that
handle and id.  Only a request without parameters is read so: its Work shares nothing a
backend may change (a Request's empty parameters are a dict of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import orjson

from inferpool.wire.worker.protocol import (
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

_HEAD = b'["execute",[[['  # an Execute's bytes up to its first request's handle


class BrokerReader:
    """Decodes the broker's messages (as ``decode_from_broker``), a repeated record to the
    records its first decoding made."""

    __slots__ = ("_free", "_inputs", "_last", "_outputs", "_parse")

    def __init__(self) -> None:
        # each: (the raw JSON value last decoded, the records made of it)
        self._inputs: tuple[Any, list[TensorRef]] = (None, [])
        self._outputs: tuple[Any, list[WantedOutput]] = (None, [])
        self._free: tuple[Any, list[Slot]] = (None, [])
        # the last batch of one request: its bytes after its request's id, its Execute
        self._last: tuple[bytes, Execute] = (b"", Execute([]))
        table: dict[str, Callable[[Any], Any]] = {**FROM_BROKER, Kind.EXECUTE: self._execute}
        self._parse: Callable[[bytes], BrokerMessage] = partial(decode, table, "broker")

    def decode(self, data: bytes | memoryview) -> BrokerMessage:
        """A message the broker sent; INTERNAL if it is not one."""
        data = bytes(data)
        tail, last = self._last
        if tail and data.endswith(tail) and data.startswith(_HEAD):
            try:
                rid, id_ = orjson.loads(b"[" + data[len(_HEAD) : -len(tail)] + b"]")
            except (ValueError, TypeError):  # not a handle and an id: parsed below
                pass
            else:
                if type(rid) is int and type(id_) is str:
                    work = last.requests[0]
                    again = _new(Work, (rid, id_, *work[2:]))
                    return _new(Execute, ([again], *last[1:]))
        msg = self._parse(data)
        if type(msg) is Execute and len(msg.requests) == 1:
            work = msg.requests[0]
            head = b"%s%s,%s" % (_HEAD, orjson.dumps(work.rid), orjson.dumps(work.id))
            if not work.parameters and data.startswith(head):
                self._last = (data[len(head) :], msg)  # from the comma after the id
        return msg

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
