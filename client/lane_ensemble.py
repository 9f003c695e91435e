"""An ensemble over lanes: its steps run by the client's library, no broker on the path.

``open_lane`` on an ensemble (asked with ``steps``) grants a lane per step, to an instance of
the step's model, and the ensemble's wiring.  An :class:`EnsembleLane` then runs each
request as the broker's ensemble scheduler would: a step is posted on its model's lane as
soon as every tensor it reads exists, with the batch dimension added or removed where one
side batches and the other does not, and a failing step fails the request, named.

Nothing moves between the steps.  A tensor the later steps read is written by its step
straight into a window of the client's own input region (a lane request may place its
outputs there, PROTOCOL.md), and the next step reads it there in place; each request in flight
has its own windows (the asyncio client runs many at once).  A window's size is learnt from
the first request: an output that does not fit its window (the first time,
or a larger shape) comes back in the worker's region, is copied into a window of its size
once, and the window is kept.  The ensemble's outputs stay in the last steps' workers'
regions and are leased to the caller, as any lane result's.

When a lane of the ensemble ends, the broker ends them all: a step not taken yet raises
:class:`~inferpool.client.lane.LaneRevoked`, and the caller sends the whole request on the
broker path (steps that ran already run again there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferpool.client.lane import Lane
from inferpool.client.shm_request import HANDLE, INPUT_REGION, Releaser, ShmRequest, ShmResult
from inferpool.wire import lane as wl
from inferpool.wire import lane_records as lr
from inferpool.wire.contract import (
    TensorSpec,
    batch_reshape,
    check_byte_size,
    check_input,
    check_required,
    spec_of,
)
from inferpool.wire.errors import InferpoolError, invalid_arg

if TYPE_CHECKING:
    from inferpool.client.lane_async import AsyncLane
    from inferpool.client.shm_core import ShmSession

# An ensemble tensor of a request being run, in the client's region: its offset, datatype,
# shape, byte size, and whether a side that batches made it
Where = tuple[int, str, tuple[int, ...], int, bool]
MASK = 0xFFFFFFFF


def _specs(entries: list[dict[str, Any]]) -> dict[str, TensorSpec]:
    return {d["name"]: spec_of(d["name"], d["datatype"], d["dims"]) for d in entries}


class _Step:
    """One step of the ensemble: its lane, and how its model names the tensors."""

    def __init__(self, index: int, grant: dict[str, Any], lane: Lane) -> None:
        self.index = index
        self.lane = lane
        self.model = lane.model
        self.batching = grant["max_batch_size"] > 0
        self.reads: dict[str, str] = dict(grant["input_map"])  # model input -> tensor
        self.writes: dict[str, str] = dict(grant["output_map"])  # model output -> tensor
        self.specs = _specs(grant["inputs"])
        self.wanted = [lane.outputs.index(name) for name in self.writes]
        self.last: tuple[Any, tuple[bytes, int, int]] = (None, (b"", 0, 0))  # key, body

    def failed(self, ensemble: str, err: InferpoolError) -> InferpoolError:
        return InferpoolError(
            err.code,
            f"in ensemble '{ensemble}', step {self.index} (model '{self.model}') failed: "
            f"{err.message}",
        )


class _Windows:
    """Where one run's tensors that later steps read are written, in the client's region:
    a set per request in flight (one for the blocking client; the asyncio client runs many
    at once), kept from one request to the next."""

    def __init__(self, session: ShmSession) -> None:
        self.session = session
        self.spans: dict[str, tuple[int, int]] = {}  # tensor -> (offset, capacity)
        self.placing = 0  # bumped whenever a window is made: the steps' bodies change
        # where each tensor later steps read lay the last time: a step that reads it may be
        # posted before it is made, to run once its maker answers (workers.lane_after)
        self.expected: dict[str, Where] = {}

    def window(self, tensor: str, nbytes: int) -> int:
        """The offset of ``tensor``'s window, made (or grown) to hold ``nbytes``."""
        known = self.spans.get(tensor)
        if known is not None and known[1] >= nbytes:
            return known[0]
        if known is not None:
            del self.spans[tensor]
            self.session.free(known[0])
        offset = self.session.alloc(nbytes, f"ensemble tensor '{tensor}'")
        self.spans[tensor] = (offset, nbytes)
        self.placing += 1
        return offset

    def close(self) -> None:
        for offset, _ in self.spans.values():
            self.session.free(offset)
        self.spans.clear()


class EnsembleLane:
    """The lanes of one ensemble, granted together, and the runs of its requests."""

    def __init__(self, session: ShmSession, grant: dict[str, Any], spin_us: int) -> None:
        self.session = session
        self.model: str = grant["model_name"]
        self.version: str = grant["model_version"]
        self.max_batch_size: int = grant["max_batch_size"]
        self.spare: list[_Windows] = []  # window sets no run is using
        self.copies = 0  # outputs copied into their windows (none once the windows fit)
        self.runs = 0  # requests run: each one's steps carry its number as their id
        self.ahead = 0  # steps posted before the step they read from had answered
        self.redone = 0  # steps posted again: the tensor they waited for lay elsewhere
        self.lanes: list[Lane] = []
        try:
            for lane_grant in grant["lanes"]:
                self.lanes.append(Lane(session, lane_grant, spin_us))
        except BaseException:
            self.close()
            raise
        self.id = self.lanes[0].id  # closing any of them closes them all (the broker)
        self.inputs = _specs(grant["inputs"])
        self.required = frozenset(d["name"] for d in grant["inputs"] if not d.get("optional"))
        self.output_specs = _specs(grant["outputs"])
        self.outputs = frozenset(self.output_specs)
        pairs = zip(grant["steps"], self.lanes, strict=True)  # step i runs on lane i
        self.steps = [_Step(i, step, lane) for i, (step, lane) in enumerate(pairs)]
        # the tensors later steps read: they are placed in windows of the client's region
        self.read = frozenset(t for step in self.steps for t in step.reads.values())

    # ------------------------------------------------------------------ a request
    def body(self, request: ShmRequest) -> dict[str, Where] | None:
        """The request's inputs as ensemble tensors (checked as the broker checks an
        ensemble's request), or None when it cannot run over lanes (inputs outside the
        input region, outputs into windows, parameters): the broker path takes it."""
        cached = request.lane_cache
        if cached is not None and cached[0] == (self.id, request.revision):
            return cached[1]
        found = self._check(request)
        request.lane_cache = ((self.id, request.revision), found)
        return found

    def _check(self, request: ShmRequest) -> dict[str, Where] | None:
        header = request.header
        if "parameters" in header:
            return None
        if any(spec["parameters"] != HANDLE for spec in header["outputs"]):
            return None
        found: dict[str, Where] = {}
        batch = 0
        batched = self.max_batch_size > 0
        for entry in header["inputs"]:
            params = entry["parameters"]
            if params["shared_memory_region"] != INPUT_REGION:
                return None
            name, datatype, shape = entry["name"], entry["datatype"], tuple(entry["shape"])
            spec = self.inputs.get(name)
            if spec is None:
                raise invalid_arg(f"unexpected inference input '{name}' for model '{self.model}'")
            batch, expected = check_input(
                self.model, spec, datatype, shape, self.max_batch_size, batch
            )
            nbytes = params["shared_memory_byte_size"]
            check_byte_size(self.model, name, expected, nbytes)
            found[name] = (params["shared_memory_offset"], datatype, shape, nbytes, batched)
        check_required(self.model, self.required, set(found))
        return found

    def run(self, request: ShmRequest, limit: float) -> ShmResult | None:
        """Run the ensemble on ``request`` within ``limit`` seconds: its result, whose
        outputs are leased from the workers of the steps that made them; None if it cannot
        run over lanes (``body``)."""
        inputs = self.body(request)
        if inputs is None:
            return None
        run = self._run(inputs, limit)
        try:
            return run.go()
        except BaseException:
            run.drop()
            raise
        finally:
            self.spare.append(run.windows)

    async def run_async(
        self, request: ShmRequest, limit: float, lane_of: Callable[[Lane], AsyncLane]
    ) -> ShmResult | None:
        """``run`` for the asyncio client: each step awaited on its lane's ``AsyncLane``
        (``lane_of``), many requests in flight, each with its own windows."""
        inputs = self.body(request)
        if inputs is None:
            return None
        run = self._run(inputs, limit)
        try:
            return await run.go_async(lane_of)
        except BaseException:
            run.drop()
            raise
        finally:
            self.spare.append(run.windows)

    def _run(self, inputs: dict[str, Where], limit: float) -> _Run:
        windows = self.spare.pop() if self.spare else _Windows(self.session)
        return _Run(self, dict(inputs), windows, time.monotonic() + limit)

    def copy_in(self, windows: _Windows, tensor: str, lane: Lane, offset: int, nbytes: int) -> int:
        """Copy ``tensor``, an output at ``offset`` in ``lane``'s worker's region, into
        its window (which fits it from now on); the window's offset."""
        own, source = self.session.region, self.session.mapped.get(lane.output_region)
        assert own is not None  # the broker grants lanes only to a client with one
        at = windows.window(tensor, nbytes)
        own.buf[at : at + nbytes] = source.buf[offset : offset + nbytes]
        self.copies += 1
        return at

    # ------------------------------------------------------------------ lifetime
    def flush(self, limit: float) -> int:
        return sum(lane.flush(limit) for lane in self.lanes if lane.usable)

    @property
    def usable(self) -> bool:
        return all(lane.usable for lane in self.lanes)

    def close(self) -> None:
        for lane in self.lanes:
            lane.close()
        for windows in self.spare:
            windows.close()
        self.spare.clear()


class _Run:
    """One request through the ensemble's steps."""

    def __init__(
        self, ensemble: EnsembleLane, inputs: dict[str, Where], windows: _Windows, deadline: float
    ) -> None:
        self.ensemble = ensemble
        self.windows = windows
        self.deadline = deadline
        self.tensors = inputs  # ensemble tensor -> where it lies in the client's region
        self.final: dict[str, tuple[Any, bool]] = {}  # output -> (its array, batched)
        self.held: list[ShmResult] = []  # results whose outputs the answer keeps
        self.waits: dict[int, int] = {}  # step -> the step whose answer it was posted after
        self.promised: dict[str, list[int]] = {}  # tensor -> steps posted to read it where
        # it lay last time (windows.expected), before it was made
        self.redo: set[int] = set()  # steps posted on a promise their maker did not keep

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def go(self) -> ShmResult:
        """Post every step whose tensors exist, or will once one step posted before it
        answers (then it waits for that answer on its lane: no turn of this client between
        the two); take the oldest answer; again, until every step has run."""
        ensemble = self.ensemble
        ensemble.runs = run_id = (ensemble.runs + 1) & 0xFFFFFFFFFFFFFFFF
        waiting = list(ensemble.steps)
        posted: list[tuple[_Step, int]] = []
        while waiting or posted:
            batch: list[tuple[_Step, int, lr.After | None]] = []
            for step in list(waiting):
                planned = posted + [(s, n) for s, n, _ in batch]
                ready, maker = self._maker(step, planned)
                if not ready:
                    continue
                lane = step.lane
                if (lane.sent - lane.read) & MASK >= lane.slots:
                    if any(p[0].lane is lane for p in planned):
                        continue  # posted once that step's answer is read
                    lane.make_room(self.left())  # answers of given-up requests: dropped
                waiting.remove(step)
                after = None if maker is None else self._after(step, maker, planned)
                batch.append((step, lane.sent, after))  # its number once posted
                if maker is not None:
                    self.waits[step.index] = maker.index
                    ensemble.ahead += 1
            # the steps that wait first: a worker woken by its request may take this
            # client's core and run its step before the client posts on
            for step, _, after in reversed(batch):
                step.lane.post(self._body(step), 0, after, run_id)
            posted += [(step, n) for step, n, _ in batch]
            if not posted:
                raise self.deadlock()
            step, n = posted.pop(0)
            try:
                result = step.lane.result(n, self.left())
            except InferpoolError as err:
                if step.index in self.redo:  # it waited for a tensor made elsewhere: again
                    self.redo.discard(step.index)
                    waiting.append(step)
                    continue
                raise step.failed(ensemble.model, err) from None
            if step.index in self.redo:  # ran on what it was promised: run it again
                self.redo.discard(step.index)
                result.release()
                waiting.append(step)
                continue
            self._took(step, result, posted)
        return self._answer()

    def _maker(self, step: _Step, posted: list[tuple[_Step, int]]) -> tuple[bool, _Step | None]:
        """Whether ``step`` can be posted now: when every tensor it reads exists, or
        when one posted step makes the others and they will lie where they did last time
        (then that step is returned: ``step`` waits for it)."""
        makers = set()
        expected = self.windows.expected
        for tensor in step.reads.values():
            if tensor in self.tensors:
                continue
            maker = self._made_by(tensor, posted) if tensor in expected else None
            if maker is None:
                return False, None
            makers.add(maker)
        if len(makers) > 1:
            return False, None
        return True, (makers.pop() if makers else None)

    @staticmethod
    def _made_by(tensor: str, posted: list[tuple[_Step, int]]) -> _Step | None:
        for step, _ in posted:
            if tensor in step.writes.values():
                return step
        return None

    def _after(self, step: _Step, maker: _Step, posted: list[tuple[_Step, int]]) -> lr.After:
        """What ``step`` waits for: ``maker``'s answer, which writes the tensors it reads
        that do not exist yet where they lay last time (they are taken as lying there)."""
        n = next(m for s, m in posted if s is maker)
        mask = 0
        made = set(maker.writes.values())
        for i, tensor in enumerate(step.reads.values()):
            if tensor in made:
                mask |= 1 << i
                self.promised.setdefault(tensor, []).append(step.index)
        return lr.After(maker.index, n, mask)

    async def go_async(self, lane_of: Callable[[Lane], AsyncLane]) -> ShmResult:
        """``go`` on the event loop: every step whose tensors exist awaited on its lane,
        the next ones started as answers come; a failure cancels the steps in flight."""
        waiting = list(self.ensemble.steps)
        running: dict[asyncio.Future[ShmResult], _Step] = {}
        try:
            while waiting or running:
                for step in [s for s in waiting if self._ready(s)]:
                    waiting.remove(step)
                    asking = lane_of(step.lane).run(self._body(step), self.left())
                    running[asyncio.ensure_future(asking)] = step
                if not running:
                    raise self.deadlock()
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    try:
                        result = task.result()
                    except InferpoolError as err:
                        raise step.failed(self.ensemble.model, err) from None
                    self._took(step, result, [])
            return self._answer()
        finally:
            for task in running:  # their lanes cancel them and give back their answers
                task.cancel()

    def _ready(self, step: _Step) -> bool:
        return all(t in self.tensors for t in step.reads.values())

    def _body(self, step: _Step) -> tuple[bytes, int, int]:
        """Step ``step``'s request: its inputs where their tensors lie, the outputs that
        later steps read placed in their windows (once their size is known)."""
        ensemble, lane, windows = self.ensemble, step.lane, self.windows
        # a tensor not made yet is read where it lay last time (the step waits for it)
        places = [self.tensors.get(t) or windows.expected[t] for t in step.reads.values()]
        key = (windows, windows.placing, *places)
        if step.last[0] == key:  # the same places as the last request's: the same body
            return step.last[1]
        inputs = []
        for name, where in zip(step.reads, places, strict=True):
            offset, datatype, shape, nbytes, batched = where
            spec = step.specs.get(name)
            if spec is not None:
                shape = tuple(batch_reshape(spec, step.batching, batched, shape))
            position, code = lane.inputs[name], wl.DATATYPES[datatype]
            inputs.append(wl.Tensor(position, code, offset, nbytes, shape))
        spans = windows.spans
        placed = {
            index: spans[tensor]
            for index, tensor in zip(step.wanted, step.writes.values(), strict=True)
            if tensor in spans and tensor not in ensemble.outputs
        }
        body = lr.pack_request_body(inputs, step.wanted, placed), len(inputs), len(step.wanted)
        step.last = (key, body)
        return body

    def _took(self, step: _Step, result: ShmResult, posted: list[tuple[_Step, int]]) -> None:
        """Step ``step``'s result: each output where the steps that read it find it (in
        the client's region), or kept for the answer (an output of the ensemble).  A step
        posted to read an output where it lay last time runs again if it lies elsewhere now
        (it grew out of its window), and so does every step posted after that one."""
        ensemble = self.ensemble
        kept = False
        for name, offset, nbytes, spec, _, _, placed in result.layout:
            tensor = step.writes[name]
            if tensor in ensemble.outputs:
                self.final[tensor] = (result.outputs[name], step.batching)
                kept = True
            if tensor not in ensemble.read:
                continue
            if not placed:  # in the worker's region: copied into the tensor's window
                offset = ensemble.copy_in(self.windows, tensor, step.lane, offset, nbytes)
            shape = tuple(spec["shape"])
            where = self.tensors[tensor] = (offset, spec["datatype"], shape, nbytes, step.batching)
            expected = self.windows.expected
            if expected.get(tensor) != where:
                expected[tensor] = where
                for reader in self.promised.get(tensor, ()):
                    self._redo(reader, posted)
        if kept:
            self.held.append(result)
        else:
            result.release()

    def _redo(self, index: int, posted: list[tuple[_Step, int]]) -> None:
        """Step ``index`` (posted on a promise) and the steps posted after it run again."""
        self.redo.add(index)
        self.ensemble.redone += 1
        for step, _ in posted:
            if self.waits.get(step.index) == index and step.index not in self.redo:
                self._redo(step.index, posted)

    def _answer(self) -> ShmResult:
        ensemble = self.ensemble
        batching = ensemble.max_batch_size > 0
        outputs = {}
        for name, spec in ensemble.output_specs.items():
            if name not in self.final:  # a step did not answer with an output it was asked
                raise self.deadlock()
            array, batched = self.final[name]
            shape = tuple(batch_reshape(spec, batching, batched, array.shape))
            outputs[name] = array if shape == array.shape else array.reshape(shape)
        parts = [(result._session, result._leases) for result in self.held]
        for result in self.held:
            result._leases = []
        self.held = []
        leases = [lease for _, mine in parts for lease in mine]
        return ShmResult(_Parts(parts), ensemble.model, ensemble.version, outputs, {}, leases)

    def deadlock(self) -> InferpoolError:
        """Triton's words for an ensemble request that cannot make all its outputs."""
        return invalid_arg(
            f"in ensemble '{self.ensemble.model}', unexpected deadlock, at least one output "
            "is not set while no more ensemble steps can be made"
        )

    def drop(self) -> None:
        """The run failed: what it holds goes back."""
        for result in self.held:
            result.release()
        self.held = []


class _Parts:
    """The releaser of an ensemble's answer: each step's leases go back on its own lane
    (steps on one instance share its output region, so the region cannot tell)."""

    def __init__(self, parts: list[tuple[Releaser, list[tuple[Any, str]]]]) -> None:
        self.parts = parts

    def release(self, leases: list[tuple[Any, str]]) -> None:
        for lane, mine in self.parts:
            lane.release(mine)
        self.parts = []
