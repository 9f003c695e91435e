"""What a lane request's body comes to, checked once (workers/lanes.py serves the lane).

A lane names the model's tensors by their index in the configuration (:class:`Contract`).
A client sends the same body (inputs' places and shapes, wanted outputs) over and over, so
each body is checked once, against the model and against the client's own region (the
only memory a lane may read inputs from), and its plan kept: the inputs' views, the same
every time the body comes again.  The Request a backend sees (the broker path's class) is
made from the plan; for a body that just came, the next one is made ahead (``prepare``,
after the answer went out, while the client reads it), so the request that follows finds
it ready.  BYTES inputs are decoded afresh for every request: their elements are copies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from inferpool.backends.api import InputTensor, OutputMemory, Request, RequestedOutput, Response
from inferpool.backends.reshape import output_reshapes
from inferpool.shm.region import Region
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire.contract import InputChecks, TensorSpec, check_byte_size, tensor_spec
from inferpool.wire.errors import invalid_arg
from inferpool.wire.worker.protocol import TensorRef
from inferpool.workers.memory import WorkerMemory, host_input

# For each input: its InputTensor, or None for BYTES (decoded per request), and where it lies.
PlanInput = tuple["InputTensor | None", TensorRef, "tuple[int, ...] | None"]
# its inputs, the outputs it wants, whether its Request can be made ahead (no BYTES input),
# the memory its outputs go into
Plan = tuple[list[PlanInput], dict[str, RequestedOutput], bool, OutputMemory]
Key = tuple[int, int, bytes]  # inputs, outputs, the body's bytes
PLANS = 16  # request bodies a lane remembers as checked
Emit = Callable[[Request, "Response | None", bool], None]
Cancelled = Callable[[int], bool]  # whether the client has cancelled request n


class Contract:
    """The model's tensors as a lane names them: by their index in the configuration."""

    def __init__(self, config: Any, reshapes: dict[str, tuple[int, ...]]) -> None:
        self.model = config.name
        self.max_batch_size = int(config.max_batch_size)
        self.batched = self.max_batch_size > 0
        self.inputs: list[TensorSpec] = [tensor_spec(t, t.optional) for t in config.input]
        self.outputs = [t.name for t in config.output]
        self.required = frozenset(s.name for s in self.inputs if not s.optional)
        self.reshapes = reshapes
        self.all_outputs = {name: RequestedOutput(name) for name in self.outputs}
        self.output_index = {name: i for i, name in enumerate(self.outputs)}
        self.output_reshapes = output_reshapes(config)  # the client sees the config's dims


class Window(NamedTuple):
    """Where in the client's region a lane request wants an output written."""

    offset: int
    byte_size: int


class ClientWindows:
    """Output memory for a lane request that places outputs in the client's own region
    (``Window`` targets); an output too large for its window, and every other output, go
    into the worker's output region as usual."""

    def __init__(self, memory: WorkerMemory, region: Region) -> None:
        self.memory = memory
        self.region = region

    def allocate(self, output: RequestedOutput | None, nbytes: int) -> tuple[str, int, Any]:
        window = output.target if output is not None else None
        if type(window) is not Window or nbytes > window.byte_size:
            return self.memory.allocate(None, nbytes)
        offset = window.offset
        return self.region.name, offset, self.region.buf[offset : offset + nbytes]

    def release(self, region: str, offset: int) -> None:
        self.memory.release(region, offset)  # the client's region has nothing to give back

    def slot_views(self, region: str) -> dict[Any, Any] | None:
        return self.memory.slot_views(region)


class Plans:
    """One lane's checked bodies; ``inputs``: the client's region (inputs are read from it
    through read-only views; outputs may be placed in it)."""

    def __init__(
        self,
        contract: Contract,
        inputs: Region,
        memory: WorkerMemory,
        emit: Emit,
        cancelled: Cancelled,
    ):
        self.contract = contract
        self.inputs = inputs
        self.memory = memory
        self.emit = emit
        self.cancelled = cancelled
        self.placing = ClientWindows(memory, inputs)
        self._plans: dict[Key, Plan] = {}
        self._last: tuple[Key, Plan] | None = None  # the plan of the latest request
        self._ready: tuple[Key, Request] | None = None  # a Request made ahead for it

    def request(self, n: int, req: wl.LaneRequest) -> Request:
        """The Request of lane request ``n`` (INVALID_ARG for a body that fails its check)."""
        key = (req.n_inputs, req.n_outputs, req.body)
        ready, self._ready = self._ready, None
        if ready is not None and ready[0] == key:
            request = ready[1]
            request.id = str(req.id)
            request.handle = n
            return request
        plan = self._plans.get(key)
        if plan is None:
            plan = self._check(req)
            if len(self._plans) >= PLANS:
                self._plans.clear()
            self._plans[key] = plan
        self._last = (key, plan)
        return self._make(plan, str(req.id), n)

    def prepare(self) -> None:
        """Make the Request of the next request ahead, for the body the latest one had
        (not for BYTES inputs: those are read when the request comes)."""
        last = self._last
        if last is not None and self._ready is None and last[1][2]:
            self._ready = (last[0], self._make(last[1], "", -1))

    def clear(self) -> None:
        """Drop every plan and the Request made ahead (their views of the client's region)."""
        self._plans.clear()
        self._last = self._ready = None

    def _make(self, plan: Plan, request_id: str, n: int) -> Request:
        planned, wanted, _, memory = plan
        inputs = {}
        for tensor, ref, reshape in planned:
            inputs[ref.name] = tensor or host_input(self.inputs, ref, reshape)
        return Request(
            id=request_id,
            inputs=inputs,
            requested_outputs=wanted,
            memory=memory,
            emit=self.emit,
            handle=n,
            cancelled=self.cancelled,
        )

    def _check(self, req: wl.LaneRequest) -> Plan:
        """Check a request body against the model and the client's region (INVALID_ARG in
        the broker's words): where its inputs are, which outputs it wants."""
        contract = self.contract
        model = contract.model
        specs = contract.inputs
        try:
            tensors, outputs, windows = lr.parse_body(req.body, req.n_inputs, req.n_outputs)
        except ValueError as exc:
            raise invalid_arg(f"malformed lane request: {exc}") from None
        refs: list[PlanInput] = []
        checks = InputChecks(model, contract.max_batch_size, contract.required)
        for t in tensors:
            spec = specs[t.position] if t.position < len(specs) else None
            if spec is None:
                raise invalid_arg(f"unexpected inference input {t.position} for model '{model}'")
            name = spec.name
            datatype = wl.DATATYPE_NAMES.get(t.datatype, str(t.datatype))
            expected = checks.add(spec, datatype, t.shape)
            check_byte_size(model, name, expected, t.byte_size)
            reshape = contract.reshapes.get(name)
            if reshape is not None and contract.max_batch_size > 0:
                reshape = (t.shape[0], *reshape)
            ref = TensorRef(name, datatype, t.shape, self.inputs.name, t.offset, t.byte_size)
            tensor = host_input(self.inputs, ref, reshape)  # in the region, or INVALID_ARG
            refs.append((None if datatype == "BYTES" else tensor, ref, reshape))
        checks.done()
        ahead = all(r[0] is not None for r in refs)
        if not outputs:
            return refs, contract.all_outputs, ahead, self.memory
        names = contract.outputs
        if any(i >= len(names) for i in outputs):
            raise invalid_arg(f"unexpected inference output index for model '{model}'")
        if not windows:
            return refs, {names[i]: RequestedOutput(names[i]) for i in outputs}, ahead, self.memory
        size = self.inputs.size
        for i, (offset, nbytes) in windows.items():
            if offset + nbytes > size:
                raise invalid_arg(
                    f"the window of output '{names[i]}' lies outside shared-memory region "
                    f"'{self.inputs.name}' ({offset} + {nbytes} > {size} bytes)"
                )
        wanted = {
            names[i]: RequestedOutput(names[i], Window(*windows[i]) if i in windows else None)
            for i in outputs
        }
        return refs, wanted, ahead, self.placing
