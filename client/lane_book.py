"""Which lanes a shared-memory session has, wants, and may ask for again (without I/O).

A session with ``lane=True`` wants a lane to every model it runs that lanes serve;
``client.lane(model)`` asks for one model's.  A lane is asked for (``open_lane``) the first
time a request for its model runs; a lane that ended is asked for again at most every
``RETRY_S``, the requests meanwhile taking the broker path.  A model lanes do not serve (it
batches in the broker, streams, caches: UNSUPPORTED) is not asked for again with
``lane=True``, its requests take the broker path; a refusal that would only repeat itself
otherwise (a model asked for by name, a client without an input region: INVALID_ARG) is
raised to the caller; a passing one (no ready instance, the model is unloading) just means the
broker path.

``pin``: the thread that opens a lane (it runs the lane's first request) is pinned to a core
apart from the lane's worker, so that its waits spin: ``"auto"`` picks a core no worker
holds (else one the lane's worker does not hold; else none: the thread stays as it was),
cores given by number are taken as they are.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from inferpool.client.control_calls import Call
from inferpool.client.lane import Lane
from inferpool.client.lane_ensemble import EnsembleLane
from inferpool.client.shm_request import ShmRequest
from inferpool.shm import cores
from inferpool.wire import lane_region as wl
from inferpool.wire.errors import Code, InferpoolError

if TYPE_CHECKING:
    from inferpool.client.shm_core import ShmSession

log = logging.getLogger("inferpool.client")
RETRY_S = 1.0
Key = tuple[str, str]  # (model, version as the requests name it)
AnyLane = Lane | EnsembleLane
_PERMANENT = (Code.UNSUPPORTED, Code.INVALID_ARG, Code.ALREADY_EXISTS)
Pin = str | int | Iterable[int] | None  # "auto", cores, or None: the thread is left as it is


class LaneBook:
    """The lanes a client has and asks for, by model."""

    def __init__(
        self, session: ShmSession, auto: bool, spin_us: int, slots: int, pin: Pin = None
    ) -> None:
        """``auto``: a lane for every model; ``spin_us``: how long a wait spins before it
        sleeps (when the worker runs on another core); ``slots``: requests in flight;
        ``pin``: where the thread that opens a lane goes (the module's docstring)."""
        self.session = session
        self.auto = auto
        self.spin_us = spin_us
        self.slots = slots
        self.pin = pin_option(pin)
        self.lanes: dict[Key, AnyLane] = {}
        self.wanted: set[Key] = set()
        self.unserved: set[Key] = set()  # models lanes do not serve (lane=True asks no more)
        self._retry_at: dict[Key, float] = {}

    def __len__(self) -> int:
        return len(self.lanes)

    def lane_for(self, request: ShmRequest) -> AnyLane | None:
        """The open lane ``request`` may take, if any."""
        return self.reuse(request.model, request.version) if self.lanes else None

    def reuse(self, model: str, version: str | int) -> AnyLane | None:
        """The model's lane if it is still open (an ended one is forgotten)."""
        lane = self.lanes.get((model, str(version)))
        if lane is not None and not lane.usable:
            self.lost(lane)
            return None
        return lane

    def should_open(self, request: ShmRequest) -> bool:
        if not (self.auto or self.wanted):  # the common case: no lanes asked for
            return False
        key = (request.model, request.version)
        if key in self.lanes or key in self.unserved or not (self.auto or key in self.wanted):
            return False
        return time.monotonic() >= self._retry_at.get(key, 0.0)

    def open(self, model: str, version: str | int = "") -> Call[AnyLane]:
        """The ``open_lane`` message; its answer is the Lane, recorded here."""
        key = (model, str(version))
        fields = {
            "model_name": model,
            "model_version": str(version),
            "pid": os.getpid(),
            "slots": self.slots,
            "spin_us": self.spin_us,  # the worker spins no longer for this client's requests
            "steps": True,  # an ensemble's lanes: its steps run here (client.lane_ensemble)
        }

        def read(grant: dict[str, Any]) -> AnyLane:
            made = EnsembleLane if grant.get("ensemble") else Lane
            lane = made(self.session, grant, self.spin_us)
            self.lanes[key] = lane
            self.pin_thread(lane)
            if not self.auto:  # asked for: asked for again when it ends (a refusal is not)
                self.wanted.add(key)
            return lane

        return Call("open_lane", read, fields)

    def pin_thread(self, lane: AnyLane) -> None:
        """Pin the calling thread as ``pin`` says, for ``lane``'s worker."""
        if self.pin is None:
            return
        want = self.pin
        if isinstance(want, str):  # "auto"
            one = lane.lanes[0] if isinstance(lane, EnsembleLane) else lane
            core = cores.free_core(one.held_cores, one.worker_cores)
            if core is None:
                log.info("pin='auto': no core apart from the workers' for this thread")
                return
            want = (core,)
        try:
            cores.pin(want)
        except OSError as exc:
            raise InferpoolError(
                Code.INVALID_ARG, f"cannot pin this thread to cores {list(want)}: {exc.strerror}"
            ) from None

    def refused(self, model: str, version: str, err: InferpoolError) -> None:
        """An ``open_lane`` a request made failed: with ``lane=True``, a model lanes do not
        serve takes the broker path from now on; else raise what would only fail again, or
        wait a while."""
        key = (model, version)
        if err.code is Code.UNSUPPORTED and self.auto and key not in self.wanted:
            self.unserved.add(key)
            log.info("model '%s' takes the broker path: %s", model, err.message)
            return
        if err.code in _PERMANENT:
            raise err
        self._retry_at[key] = time.monotonic() + RETRY_S

    def lost(self, lane: AnyLane) -> None:
        """``lane`` ended: forget it; a new one may be asked for after ``RETRY_S``."""
        for key, known in list(self.lanes.items()):
            if known is lane:
                del self.lanes[key]
                self._retry_at[key] = time.monotonic() + RETRY_S
        lane.close()

    def close_lane(self, model: str, version: str | int = "") -> Call[None]:
        """The ``close_lane`` message for this model's lane; once answered, requests for
        the model take the broker path (unless ``lane=True`` opens another)."""
        key = (model, str(version))
        lane = self.lanes.get(key)
        if lane is None:
            raise InferpoolError(Code.NOT_FOUND, f"no lane to model '{model}' is open")
        self.wanted.discard(key)

        def read(_reply: dict[str, Any]) -> None:
            self.lost(lane)

        return Call("close_lane", read, _closing(lane))

    def close_calls(self) -> list[Call[Any]]:
        """What a closing session says: close each lane."""
        return [
            Call("close_lane", lambda h: None, _closing(lane))
            for lane in self.lanes.values()
            if lane.usable
        ]

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.close()
        self.lanes.clear()


def _closing(lane: AnyLane) -> dict[str, Any]:
    """The ``close_lane`` message's fields: the lane, and what was released on it and not
    sent yet (the outputs stay the client's leases until released: front.lane_leases)."""
    release = []
    for one in lane.lanes if isinstance(lane, EnsembleLane) else [lane]:
        release += [wl.lane_token(one.id, token) for token in one.releases]
        one.releases = []
    return {"lane": lane.id, "release": release}


def pin_option(pin: Pin) -> str | tuple[int, ...] | None:
    """``pin`` checked: None, "auto", or the cores as a tuple (INVALID_ARG otherwise)."""
    if pin is None or pin == "auto":
        return pin
    chosen: tuple[Any, ...] = ()
    if isinstance(pin, int):
        chosen = (pin,)
    elif isinstance(pin, Iterable) and not isinstance(pin, str):
        chosen = tuple(pin)
    if not chosen or not all(type(c) is int and c >= 0 for c in chosen):
        raise InferpoolError(
            Code.INVALID_ARG, f"pin must be 'auto', a core or cores, or None; got {pin!r}"
        )
    return chosen
