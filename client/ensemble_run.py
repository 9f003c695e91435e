"""One request through an ensemble's steps over lanes (client.lane_ensemble has the lanes).

A :class:`Run` posts each step on its lane as soon as the tensors it reads exist, or, from
the second request on, as soon as the step that makes them is posted, to wait on its lane
for that step's answer (``FLAG_AFTER``, workers.lane_after); it reads the answers in the order
it posted, keeps each intermediate tensor where the steps after it read it (a window of the
client's region, ``Windows``), and answers with the outputs, leased from the workers that
made them.  The blocking client drives it with ``go``, the asyncio client with ``go_async``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from inferpool.client.lane import Lane
from inferpool.client.shm_request import Releaser, ShmResult
from inferpool.wire import ensemble_wiring as ew
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire.contract import specs_of
from inferpool.wire.ensemble_wiring import batch_reshape, ensemble_deadlock, step_failed
from inferpool.wire.errors import InferpoolError

if TYPE_CHECKING:
    from inferpool.client.lane_async import AsyncLane
    from inferpool.client.lane_ensemble import EnsembleLane
    from inferpool.client.shm_core import ShmSession

# An ensemble tensor of a request being run, in the client's region: its offset, datatype,
# shape, byte size, and whether a side that batches made it
Where = tuple[int, str, tuple[int, ...], int, bool]
MASK = 0xFFFFFFFF


class Step:
    """One step of the ensemble: where it is wired (``wired``: the tensors it reads and
    writes), its lane, and its model's inputs."""

    def __init__(self, wired: ew.Step, grant: dict[str, Any], lane: Lane) -> None:
        self.index = wired.index
        self.wired = wired
        self.lane = lane
        self.model = lane.model
        self.batching = grant["max_batch_size"] > 0
        self.specs = specs_of(grant["inputs"])
        self.wanted = [lane.outputs.index(name) for name in wired.outputs]
        self.last: tuple[Any, tuple[bytes, int, int]] = (None, (b"", 0, 0))  # key, body

    def failed(self, ensemble: str, err: InferpoolError) -> InferpoolError:
        """The ensemble request's error when this step failed with ``err``."""
        return step_failed(ensemble, self.index, self.model, err)


class NoRoom(Exception):
    """A tensor later steps read does not fit in the client's input region: the request
    takes the broker path (client.lane_ensemble)."""


class Windows:
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
        try:
            offset = self.session.alloc(nbytes, f"ensemble tensor '{tensor}'")
        except InferpoolError as err:
            raise NoRoom(err.message) from None
        self.spans[tensor] = (offset, nbytes)
        self.placing += 1
        return offset

    def close(self) -> None:
        for offset, _ in self.spans.values():
            self.session.free(offset)
        self.spans.clear()


class Run:
    """One request through the ensemble's steps."""

    def __init__(
        self,
        ensemble: EnsembleLane,
        inputs: dict[str, Where],
        wanted: frozenset[str],
        windows: Windows,
        deadline: float,
    ) -> None:
        self.ensemble = ensemble
        self.wanted = wanted  # the ensemble's outputs the request asks for
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
        posted: list[tuple[Step, int]] = []
        while waiting or posted:
            batch: list[tuple[Step, int, lr.After | None]] = []
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

    def _maker(self, step: Step, posted: list[tuple[Step, int]]) -> tuple[bool, Step | None]:
        """Whether ``step`` can be posted now: when every tensor it reads exists, or
        when one posted step makes the others and they will lie where they did last time
        (then that step is returned: ``step`` waits for it)."""
        makers = set()
        expected = self.windows.expected
        for tensor in step.wired.reads:
            if tensor in self.tensors:
                continue
            maker = self._made_by(tensor, posted) if tensor in expected else None
            if maker is None:
                return False, None
            makers.add(maker)
        if len(makers) > 1:
            return False, None
        return True, (makers.pop() if makers else None)

    def _made_by(self, tensor: str, posted: list[tuple[Step, int]]) -> Step | None:
        """The posted step that writes ``tensor``, if it is posted."""
        writer = self.ensemble.wiring.writer.get(tensor)
        return next((step for step, _ in posted if step.index == writer), None)

    def _after(self, step: Step, maker: Step, posted: list[tuple[Step, int]]) -> lr.After:
        """What ``step`` waits for: ``maker``'s answer, which writes the tensors it reads
        that do not exist yet where they lay last time (they are taken as lying there)."""
        n = next(m for s, m in posted if s is maker)
        mask = 0
        made = set(maker.wired.outputs.values())
        for i, tensor in enumerate(step.wired.inputs.values()):
            if tensor in made:
                mask |= 1 << i
                self.promised.setdefault(tensor, []).append(step.index)
        return lr.After(maker.index, n, mask)

    async def go_async(self, lane_of: Callable[[Lane], AsyncLane]) -> ShmResult:
        """``go`` on the event loop: every step whose tensors exist awaited on its lane,
        the next ones started as answers come; a failure cancels the steps in flight."""
        waiting = list(self.ensemble.steps)
        running: dict[asyncio.Future[ShmResult], Step] = {}
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

    def _ready(self, step: Step) -> bool:
        return step.wired.ready(self.tensors.__contains__)

    def _body(self, step: Step) -> tuple[bytes, int, int]:
        """Step ``step``'s request: its inputs where their tensors lie, the outputs that
        later steps read placed in their windows (once their size is known)."""
        ensemble, lane, windows = self.ensemble, step.lane, self.windows
        # a tensor not made yet is read where it lay last time (the step waits for it)
        reads = step.wired.inputs
        places = [self.tensors.get(t) or windows.expected[t] for t in reads.values()]
        key = (windows, windows.placing, *places)
        if step.last[0] == key:  # the same places as the last request's: the same body
            return step.last[1]
        inputs = []
        for name, where in zip(reads, places, strict=True):
            offset, datatype, shape, nbytes, batched = where
            spec = step.specs.get(name)
            if spec is not None:
                shape = tuple(batch_reshape(spec, step.batching, batched, shape))
            position, code = lane.inputs[name], wl.DATATYPES[datatype]
            inputs.append(wl.Tensor(position, code, offset, nbytes, shape))
        spans = windows.spans
        placed = {
            index: spans[tensor]
            for index, tensor in zip(step.wanted, step.wired.outputs.values(), strict=True)
            if tensor in spans and tensor not in ensemble.outputs
        }
        body = lr.pack_request_body(inputs, step.wanted, placed), len(inputs), len(step.wanted)
        step.last = (key, body)
        return body

    def _took(self, step: Step, result: ShmResult, posted: list[tuple[Step, int]]) -> None:
        """Step ``step``'s result: each output where the steps that read it find it (in
        the client's region), or kept for the answer (an output of the ensemble).  A step
        posted to read an output where it lay last time runs again if it lies elsewhere now
        (it grew out of its window), and so does every step posted after that one."""
        ensemble = self.ensemble
        kept = False
        for name, offset, nbytes, spec, _, _, placed in result.layout:
            tensor = step.wired.outputs[name]
            if tensor in self.wanted:
                self.final[tensor] = (result.outputs[name], step.batching)
                kept = True
            if tensor not in ensemble.wiring.readers:
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

    def _redo(self, index: int, posted: list[tuple[Step, int]]) -> None:
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
            if name not in self.wanted:
                continue
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
        return ensemble_deadlock(self.ensemble.model)

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
