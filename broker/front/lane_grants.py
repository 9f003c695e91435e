"""Lanes: the broker grants, watches and revokes client-to-worker lanes (``wire.lane_region``).

A lane is a shared-memory region between one client and one worker instance of a model
(``open_lane``): requests and responses go through it without the broker.  The broker stays
in charge of it: it creates the region (mode 0600, named for the run), tells the worker
(``LaneOpen``), counts what the lane served (``LaneStats``), and revokes it (the reason in
the region's header, both sides woken, ``LaneClose`` to the worker) when the client closes
it, disconnects or goes silent, when its input region ends, when the instance stops,
crashes or is replaced, when the model unloads or reloads, or when the server drains (its
admissions end).  The region is unlinked once
the worker has said ``LaneClosed`` (or is dead); the outputs a living client still holds
become its leases (front.lane_leases).

Which models lanes serve: front.lane_rules.
"""

from __future__ import annotations

import itertools
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferpool.broker.front.lane_leases import LaneLeases
from inferpool.broker.front.lane_rules import check_rule, ensemble_wiring
from inferpool.broker.front.registrations import Registration, Registrations
from inferpool.broker.front.router import Handler
from inferpool.broker.models.blame import shrank_text
from inferpool.broker.models.registry import Instance, ModelVersion, Registry
from inferpool.broker.pool.handle import WorkerState
from inferpool.shm.guarded import GuardedRegion
from inferpool.shm.region import ShmExhausted
from inferpool.shm.runs import region_name
from inferpool.shm.window import shrunk
from inferpool.wire import lane_region as wl
from inferpool.wire.contract import spec_entries
from inferpool.wire.ensemble_wiring import Wiring
from inferpool.wire.errors import Code, InferpoolError, invalid_arg, not_found
from inferpool.wire.worker.protocol import LaneClose, LaneClosed, LaneOpen, LaneStats

log = logging.getLogger("inferpool.lanes")
INPUT_REGION = "inputs"  # the region a shared-memory client's inputs live in
EXTENSIONS = ("lanes",)
LISTENING = (WorkerState.READY, WorkerState.STOPPING)  # a worker told LaneClose hears it
BARRED = 1024  # principals remembered as barred from lanes (the oldest forgotten first)


@dataclass(eq=False)
class Lane:
    """One lane: its client, its instance, its region and its input region."""

    id: int
    owner: bytes
    model: ModelVersion
    worker: Instance
    region: GuardedRegion  # the client may shrink it: never touched through a mapping
    geometry: wl.Geometry
    inputs: Registration  # the client's server-made input region
    ensemble: ModelVersion | None = None  # the ensemble whose steps it serves, if any
    whole: bool = False  # its step's requests count the ensemble's (its last output's step)
    revoked: bool = False
    held: int = 0  # output bytes its client holds on it, as its worker last said


@dataclass(frozen=True)
class _Ask:
    """What an ``open_lane`` asks for, checked."""

    owner: bytes
    pid: int
    spin: int  # within the server's --lane-spin-us
    slots: int
    reg: Registration  # the client's server-made input region


class Lanes:
    """The lanes granted to clients: ``open_lane``, ``close_lane``, and their end with their client,
    instance, model or input region."""

    def __init__(
        self,
        run_id: str,
        registry: Registry,
        registrations: Registrations,
        alive: Callable[[], list[Instance]],
        spin_us: int,
        kept: LaneLeases,
        rate_limited: bool = False,
    ) -> None:
        """``alive()``: the workers running now (the supervisor's); ``spin_us``: how long a
        worker spins for its lanes' next request;
        ``kept``: where the outputs a client holds when its lane ends become its leases;
        ``rate_limited``: the broker gates executions (``--rate-limit``): no lanes."""
        self.run_id = run_id
        self.kept = kept
        self.registry = registry
        self.registrations = registrations
        self.alive = alive
        self.spin_us = spin_us
        self.rate_limited = rate_limited
        self.lanes: dict[int, Lane] = {}
        self.drained = ""  # why the server drains ("": it does not)
        self._barred: dict[str, None] = {}  # principals whose shrunk regions killed a worker
        self._ids = itertools.count(1)
        self.shares = kept.shares
        self.shares.crossed = self._share_crossed  # lanes refuse a client over its share

    def handlers(self) -> dict[str, Handler]:
        return {"open_lane": self.open_lane, "close_lane": self.close_lane}

    # ------------------------------------------------------------------ client messages
    def open_lane(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        owner = e[0]
        if self.drained:
            raise InferpoolError(Code.UNAVAILABLE, f"the server is draining ({self.drained})")
        mv = self.registry.resolve(h.get("model_name"), h.get("model_version"))
        wiring = ensemble_wiring(mv)
        if wiring is not None and h.get("steps") is not True:
            raise InferpoolError(
                Code.UNSUPPORTED,
                f"model {mv.label} is an ensemble: lanes serve its steps to a client that runs "
                "them itself and asks with 'steps' (ShmClient does); use the broker path",
            )
        if wiring is None:
            check_rule(mv, self.rate_limited)
        pid = h.get("pid")
        if type(pid) is not int or not 0 < pid <= wl.MAX_PID:
            raise invalid_arg(
                f"open_lane needs 'pid': the client's process id (1..{wl.MAX_PID}), got {pid!r}"
            )
        spin = h.get("spin_us", self.spin_us)
        if type(spin) is not int or spin < 0:
            raise invalid_arg(f"open_lane 'spin_us' must be a non-negative integer, got {spin!r}")
        slots = h.get("slots", wl.DEFAULT_SLOTS)
        if type(slots) is not int or not 1 <= slots <= wl.MAX_SLOTS:
            raise invalid_arg(f"open_lane 'slots' must be an integer in 1..{wl.MAX_SLOTS}")
        name = h.get("input_region", INPUT_REGION)
        reg = self.registrations.created(owner, name) if isinstance(name, str) else None
        if reg is None:
            raise invalid_arg(
                f"open_lane needs a server-made input region {name!r} of this client "
                "(create_shared_memory_region): lane inputs are read from it and nowhere else"
            )
        if reg.principal in self._barred:
            raise InferpoolError(
                Code.UNSUPPORTED,
                f"{reg.principal} shrank a region of its lanes while a worker read it: it "
                "gets no lanes any more (use the broker path)",
            )
        ask = _Ask(owner, pid, min(spin, self.spin_us), slots, reg)
        if wiring is not None:
            return self._open_ensemble(mv, wiring, ask)
        if any(la.model is mv and not (la.ensemble or la.revoked) for la in self._mine(ask)):
            raise InferpoolError(
                Code.ALREADY_EXISTS, f"this client already has a lane to model {mv.label}"
            )
        lane = self._make(mv, ask)
        self._announce(lane, ask)
        return self._grant(lane)

    def _make(self, mv: ModelVersion, ask: _Ask, ensemble: ModelVersion | None = None) -> Lane:
        """A lane of ``ask``'s client to an instance of ``mv`` (for ``ensemble``'s runs),
        not yet announced to its worker."""
        worker = self._pick(mv)
        lane_id = next(self._ids)
        geometry = wl.Geometry(ask.slots, wl.SLOT_SIZE)
        principal = ask.reg.principal  # whose server-made memory the lane's region counts as
        self.registrations.charge(principal, geometry.size, f"lane to model {mv.label}")
        try:
            region = GuardedRegion.create(region_name(self.run_id, f"lane{lane_id}"), geometry.size)
        except ShmExhausted as exc:
            self.registrations.refund(principal, geometry.size)
            raise InferpoolError(Code.UNAVAILABLE, f"no room for a lane: {exc}") from None
        region.write(0, wl.header_bytes(geometry))
        region.write_word(wl.HELD_KIB, _kib(self.shares.held_by(ask.owner)))
        owner = ask.owner
        lane = Lane(lane_id, owner, mv, worker, region, geometry, ask.reg, ensemble)
        self.lanes[lane_id] = lane  # (its client is watched: it made the input region)
        return lane

    def _announce(self, lane: Lane, ask: _Ask, siblings: tuple[str, ...] = ()) -> None:
        """Tell the lane's worker to serve it (``siblings``: an ensemble's lanes, by step)."""
        share = self.shares.share
        opening = LaneOpen(
            lane.id, lane.region.name, ask.reg.key, ask.pid, ask.spin, siblings, share
        )
        lane.worker.send(opening)
        owner, instance = lane.owner.hex(), lane.worker.name
        log.info("lane %d open: client %s, instance %s", lane.id, owner, instance)

    def _grant(self, lane: Lane) -> dict[str, Any]:
        mv, worker, geometry = lane.model, lane.worker, lane.geometry
        return {
            "lane": lane.id,
            "key": "/" + lane.region.name,
            "slots": geometry.slots,
            "slot_size": geometry.slot_size,
            "model_name": mv.name,
            "model_version": mv.version_str,
            "instance": worker.name,
            "worker_pid": worker.pid,
            "worker_cpus": worker.cpus,
            "held_cpus": sorted({c for w in self.alive() for c in w.cpus}),
            "output_region": worker.output_region,
            "inputs": [{"name": s.name, "datatype": s.datatype} for s in mv.inputs.values()],
            "outputs": list(mv.outputs),
        }

    def _open_ensemble(self, mv: ModelVersion, wiring: Wiring, ask: _Ask) -> dict[str, Any]:
        """A lane to an instance of each step's model (one per step, so that branches on
        a model of several instances run side by side), and the ensemble's wiring: the
        client's library runs the steps over them (client.lane_ensemble), each step
        reading its inputs in the client's region.  The lanes end together (``revoke``)."""
        if any(la.ensemble is mv and not la.revoked for la in self._mine(ask)):
            raise InferpoolError(
                Code.ALREADY_EXISTS, f"this client already has lanes to ensemble {mv.label}"
            )
        if mv.config.response_cache.enable:
            raise InferpoolError(
                Code.UNSUPPORTED,
                f"ensemble {mv.label} caches its responses in the broker (response_cache): "
                "lanes would bypass the cache; use the broker path",
            )
        models = []
        for step in wiring.steps:
            version = step.model_version if step.model_version > 0 else ""
            model = self.registry.resolve(step.model_name, version)
            try:
                check_rule(model, self.rate_limited)
            except InferpoolError as err:
                raise InferpoolError(
                    err.code,
                    f"in ensemble {mv.label}, step {step.index} (model '{step.model_name}'): "
                    f"{err.message}",
                ) from None
            models.append(model)
        opened: list[Lane] = []
        try:
            for model in models:
                opened.append(self._make(model, ask, mv))
        except InferpoolError:
            for lane in opened:
                self._worker_gone(lane)  # never announced: the broker unlinks it
            raise
        opened[wiring.last_writer()].whole = True  # it counts the requests
        siblings = tuple(lane.region.name for lane in opened)
        for lane in opened:
            self._announce(lane, ask, siblings)
        steps = [
            {
                **entry,
                "max_batch_size": model.max_batch_size,
                "inputs": spec_entries(model.inputs.values()),
            }
            for entry, model in zip(wiring.entries(), models, strict=True)
        ]
        return {
            "ensemble": True,
            "model_name": mv.name,
            "model_version": mv.version_str,
            "max_batch_size": mv.max_batch_size,
            "inputs": spec_entries(mv.inputs.values()),
            "outputs": spec_entries(mv.outputs.values()),
            "lanes": [self._grant(lane) for lane in opened],  # step i's is lanes[i]
            "steps": steps,
        }

    def close_lane(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        number = h.get("lane")
        if type(number) is not int:
            raise invalid_arg(f"close_lane needs 'lane': a lane's number, got {number!r}")
        release = h.get("release", [])  # what the client released on the lanes, never sent
        if not isinstance(release, list) or not all(isinstance(t, str) for t in release):
            raise invalid_arg("close_lane 'release' must be a list of lease tokens (strings)")
        lane = self.lanes.get(number)
        if lane is None or lane.owner != e[0]:
            raise not_found(f"no lane {number} of this client")
        self.revoke(lane, Code.CANCELLED, "the client closed the lane")
        self.kept.absorb(e[0], release)
        return {}

    # ------------------------------------------------------------------ revoking
    def revoke(self, lane: Lane, code: Code, reason: str, free: bool = False) -> None:
        """Tell both sides the lane is over (the region says why), then the worker;
        ``free``: the client is gone, the worker gives back the outputs it held; else they
        stay valid, as the client's leases (``KEPT``, front.lane_leases)."""
        if lane.revoked:
            return
        lane.revoked = True
        worker = lane.worker
        alive = worker.channel is not None and worker.state in LISTENING
        if alive and not free:
            lane.region.write_word(wl.KEPT, 1)  # before the state: a worker that sees it, sees this
            self.kept.expect(lane.id, lane.owner)
        _mark_revoked(lane, code, reason)
        log.info("lane %d revoked: %s", lane.id, reason)
        if lane.ensemble is not None:  # an ensemble's lanes end together
            for sibling in self._all():
                if sibling.ensemble is lane.ensemble and sibling.owner == lane.owner:
                    self.revoke(sibling, code, reason, free)
        if alive:
            worker.send(LaneClose(lane.id, free))
        else:
            self._worker_gone(lane)

    def _worker_gone(self, lane: Lane) -> None:
        """The worker will never close the lane: the broker says so for it, and unlinks."""
        lane.region.write_word(wl.WORKER_CLOSED, 1)
        lane.region.wake(wl.RESP_SEQ)
        self._destroy(lane)

    def _destroy(self, lane: Lane) -> None:
        if self.lanes.pop(lane.id, None) is None:
            return  # destroyed already
        self._hold(lane, 0)  # (what its client keeps is its leases now: lane_leases)
        self.registrations.refund(lane.inputs.principal, lane.region.size)
        lane.region.destroy()

    # ------------------------------------------------------------------ events
    def worker_closed(self, handle: Instance, msg: LaneClosed) -> None:
        lane = self.lanes.get(msg.lane)
        if lane is None or lane.worker is not handle:
            return
        if msg.error is not None:
            err = InferpoolError.from_wire(msg.error)
            self.revoke(lane, err.code, err.message)
        self.kept.adopt(lane.id, handle.output_region, msg.kept)
        self._worker_gone(lane)  # (a lane it refused at open: its client hears it here)

    def worker_stats(self, handle: Instance, msg: LaneStats) -> None:
        handle.model.stats.lanes_done(msg)
        for number, held in msg.held:  # the client's output bytes count in its share
            lane = self.lanes.get(number)
            if lane is not None and lane.worker is handle and not lane.revoked:
                self._hold(lane, held)
                self._tell_held(lane.inputs.principal, lane.owner)
        for part in msg.parts:  # ensembles' steps: their ensembles count them too
            lane = self.lanes.get(part.lane)
            if lane is not None and lane.ensemble is not None and lane.worker is handle:
                lane.ensemble.stats.steps_done(part, lane.whole)

    def instance_gone(self, handle: Instance, err: InferpoolError) -> None:
        """``handle``'s worker exited (crashed, stopped, failed): its lanes end now."""
        for lane in [la for la in self._all() if la.worker is handle]:
            self.kept.lost(lane.id)
            self.revoke(lane, Code.UNAVAILABLE, err.message)
            if lane.id in self.lanes:
                self._worker_gone(lane)

    def crash_blame(self, handle: Instance, code: int) -> str:
        """Why the death of ``handle``'s worker (exit ``code``) is a client's doing: SIGBUS
        while a client of one of its lanes had shrunk that lane's region, its input region
        or a region of its other lanes (an ensemble's step reads them); "" when not.  Such
        a client gets no lanes any more (``_barred``)."""
        if code != -signal.SIGBUS:
            return ""
        owners = {la.owner for la in self._all() if la.worker is handle}
        names: list[str] = []
        for lane in self._all():
            if lane.owner not in owners:
                continue
            shrank = []
            if lane.region.shrunk:
                shrank.append(lane.region.name)
            reg = lane.inputs
            if shrunk(reg.key, reg.inode, reg.byte_size):
                shrank.append(reg.key)
            for name in shrank:
                if f"'/{name}'" not in names:
                    names.append(f"'/{name}'")
            if shrank:
                self._bar(lane.inputs.principal)
        return shrank_text(names)

    def _bar(self, principal: str) -> None:
        self._barred[principal] = None
        while len(self._barred) > BARRED:
            del self._barred[next(iter(self._barred))]

    def version_retired(self, mv: ModelVersion, why: str) -> None:
        for lane in [la for la in self._all() if mv in (la.model, la.ensemble)]:  # outputs stay
            self.revoke(lane, Code.UNAVAILABLE, f"model {mv.label} {why}")

    def draining(self, why: str) -> None:
        """The server stopped admitting requests (a drain): every lane ends, so that its
        client's requests meet the drain on the broker path; none is granted any more."""
        self.drained = why
        for lane in self._all():
            self.revoke(lane, Code.UNAVAILABLE, f"the server is draining ({why})")

    def client_gone(self, owner: bytes, why: str) -> None:
        for lane in [la for la in self._all() if la.owner == owner]:
            self.revoke(lane, Code.UNAVAILABLE, f"the client {why}", free=True)
        self.kept.forget(owner)

    def region_ended(self, owner: bytes, name: str) -> None:
        for lane in [la for la in self._all() if la.owner == owner and la.inputs.name == name]:
            self.revoke(lane, Code.UNAVAILABLE, f"the lane's input region '{name}' was ended")

    def _hold(self, lane: Lane, held: int) -> None:
        """The lane's client holds ``held`` output bytes on it now."""
        if held > lane.held:
            self.shares.hold(lane.owner, held - lane.held)
        elif held < lane.held:
            self.shares.free(lane.owner, lane.held - held)
        lane.held = held

    def _share_crossed(self, principal: str, client: bytes) -> None:
        """``principal`` (``client``'s) came to hold its whole output share, or dropped
        below it: its lanes' workers refuse its requests while it holds it."""
        self._tell_held(principal, client)

    def _tell_held(self, principal: str, client: bytes) -> None:
        """Write what ``principal`` holds into each of its lanes (``wire.lane_region.HELD_KIB``)."""
        kib = -1
        for lane in self._all():
            if lane.inputs.principal == principal and not lane.revoked:
                if kib < 0:
                    kib = _kib(self.shares.held_by(client))
                lane.region.write_word(wl.HELD_KIB, kib)

    # ------------------------------------------------------------------ looking
    def _all(self) -> list[Lane]:
        return list(self.lanes.values())

    def _mine(self, ask: _Ask) -> list[Lane]:
        return [la for la in self.lanes.values() if la.owner == ask.owner]

    def _pick(self, mv: ModelVersion) -> Instance:
        """The ready instance with the fewest lanes."""
        ready = [
            h
            for h in mv.instances
            if h.state is WorkerState.READY and not h.passive and h.channel is not None
        ]
        if not ready:
            raise InferpoolError(Code.UNAVAILABLE, f"model {mv.label} has no ready instance")
        count = {id(h): 0 for h in ready}
        for lane in self._all():
            if id(lane.worker) in count and not lane.revoked:
                count[id(lane.worker)] += 1
        return min(ready, key=lambda h: count[id(h)])

    def open_count(self, mv: ModelVersion) -> int:
        return sum(1 for la in self._all() if la.model is mv and not la.revoked)

    def close(self) -> None:
        """The broker stops: unlink every lane region (clients keep their mappings)."""
        for lane in self._all():
            if not lane.revoked:
                _mark_revoked(lane, Code.UNAVAILABLE, "the server shut down")
            self._worker_gone(lane)


def _kib(nbytes: int) -> int:
    return min(-(-nbytes >> 10), 0xFFFFFFFF)


def _mark_revoked(lane: Lane, code: Code, reason: str) -> None:
    """Say in the lane's region that it is over and why, and wake both sides."""
    region = lane.region
    for offset, data in wl.revocation(wl.STATUS[code.value], reason):
        region.write(offset, data)
    region.wake(wl.REQ_SEQ)
    region.wake(wl.RESP_SEQ)
