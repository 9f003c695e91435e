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
broker path (steps that ran already run again there).  So does a request whose tensors
between the steps do not fit in the client's input region (``NoRoom``): the broker path needs
no room there for them, and takes the requests of the next ``CROWDED_S`` seconds too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from inferpool.client.ensemble_run import NoRoom, Run, Step, Where, Windows
from inferpool.client.lane import Lane
from inferpool.client.shm_request import HANDLE, INPUT_REGION, ShmRequest, ShmResult
from inferpool.wire.contract import (
    InputChecks,
    check_byte_size,
    check_output,
    input_spec,
    specs_of,
)
from inferpool.wire.ensemble_wiring import Wiring

CROWDED_S = 1.0  # how long requests take the broker path after one found no room

if TYPE_CHECKING:
    from inferpool.client.lane_async import AsyncLane
    from inferpool.client.shm_core import ShmSession


class EnsembleLane:
    """The lanes of one ensemble, granted together, and the runs of its requests."""

    def __init__(self, session: ShmSession, grant: dict[str, Any], spin_us: int) -> None:
        self.session = session
        self.model: str = grant["model_name"]
        self.version: str = grant["model_version"]
        self.max_batch_size: int = grant["max_batch_size"]
        self.spare: list[Windows] = []  # window sets no run is using
        self.copies = 0  # outputs copied into their windows (none once the windows fit)
        self.runs = 0  # requests run: each one's steps carry its number as their id
        self.ahead = 0  # steps posted before the step they read from had answered
        self.redone = 0  # steps posted again: the tensor they waited for lay elsewhere
        self.crowded_until = 0.0  # till when requests take the broker path (NoRoom)
        self.lanes: list[Lane] = []
        try:
            for lane_grant in grant["lanes"]:
                self.lanes.append(Lane(session, lane_grant, spin_us))
        except BaseException:
            self.close()
            raise
        self.id = self.lanes[0].id  # closing any of them closes them all (the broker)
        self.inputs = specs_of(grant["inputs"])
        self.required = frozenset(name for name, s in self.inputs.items() if not s.optional)
        self.output_specs = specs_of(grant["outputs"])
        self.outputs = frozenset(self.output_specs)
        # the tensors later steps read (wiring.readers) are placed in windows of the
        # client's region
        self.wiring = Wiring.from_entries(
            self.model, grant["steps"], list(self.inputs), list(self.output_specs)
        )
        pairs = zip(self.wiring.steps, grant["steps"], self.lanes, strict=True)  # step i: lane i
        self.steps = [Step(wired, step, lane) for wired, step, lane in pairs]

    # ------------------------------------------------------------------ a request
    def body(self, request: ShmRequest) -> tuple[dict[str, Where], frozenset[str]] | None:
        """The request's inputs as ensemble tensors and the outputs it asks for (checked as
        the broker checks an ensemble's request), or None when it cannot run over lanes
        (inputs outside the input region, outputs into windows, parameters): the broker path
        takes it."""
        if self.crowded_until and time.monotonic() < self.crowded_until:
            return None
        cached = request.lane_cache
        if cached is not None and cached[0] == (self.id, request.revision):
            return cached[1]
        found = self._check(request)
        request.lane_cache = ((self.id, request.revision), found)
        return found

    def _check(self, request: ShmRequest) -> tuple[dict[str, Where], frozenset[str]] | None:
        header = request.header
        if "parameters" in header:
            return None
        if any(spec["parameters"] != HANDLE for spec in header["outputs"]):
            return None
        model = self.model
        found: dict[str, Where] = {}
        checks = InputChecks(model, self.max_batch_size, self.required)
        batched = self.max_batch_size > 0
        for entry in header["inputs"]:
            params = entry["parameters"]
            if params["shared_memory_region"] != INPUT_REGION:
                return None
            name, datatype, shape = entry["name"], entry["datatype"], tuple(entry["shape"])
            expected = checks.add(input_spec(model, self.inputs, name), datatype, shape)
            nbytes = params["shared_memory_byte_size"]
            check_byte_size(model, name, expected, nbytes)
            found[name] = (params["shared_memory_offset"], datatype, shape, nbytes, batched)
        checks.done()
        outputs = self.outputs
        wanted = frozenset(check_output(model, outputs, spec["name"]) for spec in header["outputs"])
        return found, wanted or outputs

    def run(self, request: ShmRequest, limit: float) -> ShmResult | None:
        """Run the ensemble on ``request`` within ``limit`` seconds: its result, whose
        outputs are leased from the workers of the steps that made them; None if it cannot
        run over lanes (``body``)."""
        asked = self.body(request)
        if asked is None:
            return None
        run = self._run(*asked, limit)
        with self._ending(run):
            return run.go()
        return None  # no room for its tensors: the broker path

    async def run_async(
        self, request: ShmRequest, limit: float, lane_of: Callable[[Lane], AsyncLane]
    ) -> ShmResult | None:
        """``run`` for the asyncio client: each step awaited on its lane's ``AsyncLane``
        (``lane_of``), many requests in flight, each with its own windows."""
        asked = self.body(request)
        if asked is None:
            return None
        run = self._run(*asked, limit)
        with self._ending(run):
            return await run.go_async(lane_of)
        return None  # no room for its tensors: the broker path

    @contextlib.contextmanager
    def _ending(self, run: Run) -> Iterator[None]:
        """How a run ends, whichever client drives it: what it holds goes back if it fails,
        its windows are kept for the next; a run whose tensors did not fit in the client's
        region (NoRoom) is swallowed, and the requests of the next ``CROWDED_S`` seconds
        take the broker path."""
        try:
            yield
        except NoRoom:
            run.drop()
            self.crowded_until = time.monotonic() + CROWDED_S
        except BaseException:
            run.drop()
            raise
        finally:
            self.spare.append(run.windows)

    def _run(self, inputs: dict[str, Where], wanted: frozenset[str], limit: float) -> Run:
        windows = self.spare.pop() if self.spare else Windows(self.session)
        return Run(self, dict(inputs), wanted, windows, time.monotonic() + limit)

    def copy_in(self, windows: Windows, tensor: str, lane: Lane, offset: int, nbytes: int) -> int:
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
