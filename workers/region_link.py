"""Shared regions over the worker's channel: ``backends.shared_regions.SharedRegions`` for a model
that loads in this worker.

A model asks while it loads, before the worker serves, so the question and its answer are
the only traffic on the channel then: ``share`` sends ShareRegion and blocks until the
broker's RegionGrant for that key (the broker's boot timeout bounds the wait).  A Stop that
arrives meanwhile ends the load.
"""

from __future__ import annotations

import logging

from inferpool.backends.shared_regions import SharedRegion
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.link import Link
from inferpool.wire.worker.protocol import (
    BrokerMessage,
    RegionFilled,
    RegionGrant,
    ShareRegion,
    Stop,
)

log = logging.getLogger("inferpool.worker")


class ChannelRegions:
    """Shared regions asked of the broker over the worker's channel, while the model loads."""

    def __init__(self, link: Link[BrokerMessage]) -> None:
        self.link = link
        self.loading = True  # the worker clears it once it serves

    def share(self, key: str, byte_size: int) -> SharedRegion:
        if not self.loading:
            raise InferpoolError(
                Code.UNSUPPORTED, "shared regions can be asked for only while the model loads"
            )
        self.link.send(ShareRegion(key, byte_size))
        while True:
            msg = self.link.recv()
            if msg is None:
                raise InferpoolError(Code.UNAVAILABLE, "the broker closed the channel")
            if isinstance(msg, RegionGrant) and msg.key == key:
                if msg.error is not None:
                    raise InferpoolError.from_wire(msg.error)
                return SharedRegion(msg.region, msg.fill)
            if isinstance(msg, Stop):
                raise InferpoolError(
                    Code.UNAVAILABLE, f"told to stop while waiting for shared region '{key}'"
                )
            log.warning("%s ignored while waiting for shared region '%s'", type(msg).__name__, key)

    def filled(self, key: str, ok: bool) -> None:
        self.link.send(RegionFilled(key, ok))
