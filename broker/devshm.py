"""What a run asks of /dev/shm: checked at start, said plainly when it is too small.

Regions are created sparse and populated as they are used (``shm.warm``), so a run needs
at start only what it pre-faults (``--prefault`` of the arena; each worker pre-faults its
own output region as it boots), and at most what its regions may grow to.  A /dev/shm that
cannot hold the start is a start error naming the size needed and how to give more; one
that cannot hold the most the regions may grow to is a warning, and a request that finds
it full is answered UNAVAILABLE saying so.
"""

from __future__ import annotations

import contextlib
import logging
import os

from inferpool.broker.options import ServerOptions
from inferpool.shm.arena import Arena
from inferpool.shm.region import DEV_SHM, ROOM_HINT, MiB, Region, ShmExhausted, shm_free
from inferpool.wire.errors import Code, InferpoolError

log = logging.getLogger("inferpool.devshm")


def _mib(nbytes: int) -> str:
    return f"{nbytes / MiB:.0f} MiB" if nbytes >= MiB else f"{nbytes} bytes"


def start_arena(stack: contextlib.ExitStack, name: str, opts: ServerOptions) -> Arena:
    """The input arena with its first ``--prefault`` bytes populated (destroyed with
    ``stack``); UNAVAILABLE naming the size needed if /dev/shm cannot hold them."""
    need = min(opts.prefault, opts.arena_size)
    free = shm_free()
    if need > free:
        raise _too_small(need, free)
    region = Region.create(name, opts.arena_size, prefault=False)
    stack.callback(region.destroy)
    try:
        return Arena(region, prefault=need)
    except ShmExhausted:
        raise _too_small(need, shm_free()) from None


def _too_small(need: int, free: int) -> InferpoolError:
    return InferpoolError(
        Code.UNAVAILABLE,
        f"/dev/shm has {_mib(free)} free but the input arena pre-faults {_mib(need)} at start: "
        f"{ROOM_HINT}, or lower --prefault (or --arena-size)",
    )


def warn_if_too_small(opts: ServerOptions, workers: int) -> None:
    """Log a warning if the regions of ``workers`` workers may outgrow /dev/shm."""
    st = os.statvfs(DEV_SHM)
    size = st.f_blocks * st.f_frsize
    most = opts.arena_size + workers * opts.output_arena_size
    if most > size:
        log.warning(
            "/dev/shm is %s and this run's regions may grow to %s (the arena %s and %d output "
            "regions of %s): requests are refused with UNAVAILABLE once it is full; %s, or "
            "lower --arena-size / --output-arena-size",
            _mib(size),
            _mib(most),
            _mib(opts.arena_size),
            workers,
            _mib(opts.output_arena_size),
            ROOM_HINT,
        )
