"""The messages of a worker's channel, both directions, and how they travel.

Every message and every record in one is a NamedTuple.  On the wire a message is the JSON
array ``[kind, [field, ...]]`` and a record is the array of its fields: one orjson call each
way, no field names in the bytes, and every record comes back out as its named type (the
decoders check each record's arity).  Every request crosses the channel twice, so nothing
here loops over fields in Python.

broker -> worker  Execute (a batch to run), Free (slots and regions it is done with), Stop,
                  RegionGrant (the answer to ShareRegion), Replies (responses to its calls),
                  LaneOpen / LaneClose (a client's lane to serve, or to stop serving),
                  LogChange (log as a client's new log settings say), LaneTracing (how
                  many of its lane requests to trace)
worker -> broker  Ready (loaded: its placement and served config), Failed (why it cannot
                  boot), Items (results mid-batch, decoupled models), Done (a batch's last
                  results and its statistics), ShareRegion / RegionFilled (shared regions),
                  Mapped (CUDA regions it has opened), Unmapped (client regions it has
                  closed), Traced (the instants of traced requests' executions), Call (a
                  model's inference request
                  to another model: BLS), Query (what the broker knows of a served model,
                  answered as Replies), CancelCall (a call it gave up on), Release (reply
                  slots it has finished reading), LaneClosed (a lane it no longer serves),
                  LaneStats (what its lanes served)
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import orjson

from inferpool.wire.errors import Code, InferpoolError

# One message per datagram; below the kernel's default socket buffer cap (net.core.wmem_max
# is 208 KiB), so every datagram fits however the host is tuned.
MAX_MESSAGE = 192 * 1024

ErrorObject = dict[str, str]  # InferpoolError.to_wire()
CorrelationId = int | str
Parameters = dict[str, Any]


class Kind(str, enum.Enum):
    """The tag of each message type on a worker's channel."""

    EXECUTE = "execute"
    FREE = "free"
    STOP = "stop"
    REGION_GRANT = "region_grant"
    READY = "ready"
    FAILED = "failed"
    ITEMS = "items"
    DONE = "done"
    SHARE_REGION = "share_region"
    REGION_FILLED = "region_filled"
    MAPPED = "mapped"
    UNMAPPED = "unmapped"
    LANE_OPEN = "lane_open"
    LANE_CLOSE = "lane_close"
    LANE_CLOSED = "lane_closed"
    LANE_STATS = "lane_stats"
    CALL = "call"
    CANCEL_CALL = "cancel_call"
    QUERY = "query"
    REPLIES = "replies"
    RELEASE = "release"
    LOG_CHANGE = "log_change"
    TRACED = "traced"
    LANE_TRACING = "lane_tracing"


# ---------------------------------------------------------------------------- records
class TensorRef(NamedTuple):
    """Where a tensor's bytes lie: a work item's input, a result's output, a held state."""

    name: str
    datatype: str
    shape: Sequence[int]
    region: str  # a region name, or a client region's reference (shm.refs)
    offset: int
    byte_size: int


class Window(NamedTuple):
    """Part of a client's registered region an output is to be written into."""

    ref: str  # the region's reference (shm.refs)
    offset: int
    byte_size: int


class WantedOutput(NamedTuple):
    """An output the client asked for; ``window`` when it goes into the client's region."""

    name: str
    window: Window | None = None


# Sequence-batcher control flags of a Work item, as Triton's TRITONSERVER_REQUEST_FLAG_*.
FLAG_SEQUENCE_START = 1
FLAG_SEQUENCE_END = 2
# inferpool's own: the request is traced, its worker reports its instants (Traced); the
# worker takes it off before a backend sees the flags
FLAG_TRACE = 4


class Work(NamedTuple):
    """One request of a batch, as the worker receives it."""

    rid: int  # the broker's handle of the request; results name it
    id: str  # the client's request id
    correlation_id: CorrelationId  # 0: not part of a sequence
    flags: int  # FLAG_SEQUENCE_START | FLAG_SEQUENCE_END
    parameters: Parameters
    inputs: Sequence[TensorRef]
    outputs: Sequence[WantedOutput]
    priority: int = 0  # the priority level the request was queued at (0: none)
    timeout_us: int = 0  # the request's ``timeout`` parameter (0: none)


class Slot(NamedTuple):
    """An output slot in a worker's output region that the broker is done with."""

    region: str
    offset: int


class Durations(NamedTuple):
    """Triton's compute statistics of a request or a batch, in ns."""

    compute_input: int
    compute_infer: int
    compute_output: int


class Result(NamedTuple):
    """One response to a request: outputs in shared memory, or an error."""

    rid: int
    final: bool  # the request's last response
    outputs: Sequence[TensorRef]
    parameters: Parameters | None = None
    error: ErrorObject | None = None
    durations: Durations | None = None  # set on results of Done

    def timed(self, durations: Durations) -> Result:
        """The result with ``durations`` (cheaper than ``_replace``: it runs per request)."""
        fields = (self.rid, self.final, self.outputs, self.parameters, self.error, durations)
        return tuple.__new__(Result, fields)


class BatchStats(NamedTuple):
    """The durations of one batch of a given size."""

    batch_size: int
    durations: Durations


class MemoryUsage(NamedTuple):
    """Memory an instance holds, as TRITONBACKEND_ModelInstanceReportMemoryUsage reports it."""

    type: str  # "CPU", "CPU_PINNED" or "GPU" (TRITONSERVER_MemoryTypeString)
    id: int  # the device id (0 for CPU)
    byte_size: int


class MetricFamilyInfo(NamedTuple):
    """A custom metric family as the backend declared it."""

    name: str
    description: str
    kind: str  # "counter" or "gauge"


class MetricOp(NamedTuple):
    """A custom metric's update, folded per metric over a batch."""

    family: str
    labels: dict[str, str]
    op: str  # "inc" or "set"
    value: float


class MetricsUpdate(NamedTuple):
    """The custom metrics' families and updates a worker reports."""

    families: Sequence[MetricFamilyInfo]
    ops: Sequence[MetricOp]


class LaneBatch(NamedTuple):
    """Lane executions of one batch size, folded: how many, their durations summed."""

    batch_size: int
    executions: int
    durations: Durations


# ---------------------------------------------------------------------------- broker -> worker
class Execute(NamedTuple):
    """Run ``requests`` as one batch, after dropping what the other fields name (the broker
    may send a Work as the bytes ``encoded`` made of it: the same on the wire)."""

    requests: Sequence[Work]
    free: Sequence[Slot] = ()
    unmap: Sequence[str] = ()  # client regions no request will name again
    release: Sequence[CorrelationId] = ()  # sequences released as idle: drop their state
    nulls: Sequence[int] = ()  # batch positions of null requests (direct sequence batching)


class Free(NamedTuple):
    """Slots, client regions and sequences the broker is done with: sent to an idle worker,
    or ahead of an Execute whose own lists would not fit in its message (``split``)."""

    free: Sequence[Slot]
    unmap: Sequence[str]
    release: Sequence[CorrelationId] = ()


class Stop(NamedTuple):
    """Finish: run the finalizers and exit with EXIT_OK."""


class RegionGrant(NamedTuple):
    """The broker's answer to ShareRegion: fill the region, or attach to a filled one."""

    key: str
    region: str  # the region's name ("" with an error)
    fill: bool  # True: this worker fills it and then sends RegionFilled
    error: ErrorObject | None = None


class LaneOpen(NamedTuple):
    """Serve lane ``lane``: its region, the client's input region it may read inputs from
    (nothing else), the client's pid (to tell whether they share a core), the spin budget;
    for an ensemble's lane, the regions of the ensemble's lanes by step (its requests may
    wait for their responses: workers.lane_after; its counts also travel apart: LanePart)."""

    lane: int
    region: str  # the lane's region (wire.lane_region)
    inputs: str  # the client's server-made input region
    client_pid: int
    spin_us: int
    siblings: tuple[str, ...] = ()
    share: int = 0  # output bytes the client may hold (--client-output-share); 0: no limit


class LaneClose(NamedTuple):
    """Stop serving lane ``lane`` (its header already says why); ``free``: give back the
    outputs its client still holds (the client is gone or closed the lane), else they stay
    allocated until the worker exits (its instance is retiring: the client may still read
    them)."""

    lane: int
    free: bool = True


class Replies(NamedTuple):
    """Responses to the worker's own calls (``Call``): each Result's ``rid`` is the call's
    ``work.rid``; its outputs lie in other workers' regions, lent until ``Release``."""

    items: Sequence[Result]


class LaneTracing(NamedTuple):
    """Trace every ``rate``-th request the worker's lanes serve (0: none): its instants go
    with LaneStats (lane requests never pass the broker)."""

    rate: int


class LogChange(NamedTuple):
    """Log as these settings say from now on (a client changed them: the logging
    extension)."""

    settings: dict[str, Any]  # wire.logs.LogSettings's fields


# ---------------------------------------------------------------------------- worker -> broker
class Ready(NamedTuple):
    """The model loaded: the placement in force, the config it serves (completed) and the
    memory its backend reported."""

    placement: dict[str, Any]  # workers.pinning.read_back()
    config: dict[str, Any]  # ModelConfig as protobuf JSON
    memory: Sequence[MemoryUsage] = ()


class Failed(NamedTuple):
    """The worker cannot boot (pinning, start-up, model load); it exits EXIT_BOOT_FAILED."""

    error: ErrorObject


class Items(NamedTuple):
    """Results sent while a batch runs (decoupled models) or after it (backend threads)."""

    items: Sequence[Result]


class Done(NamedTuple):
    """A batch finished: its last results, its statistics, the custom metrics it moved."""

    items: Sequence[Result]
    batches: Sequence[BatchStats]
    metrics: MetricsUpdate | None = None


class ShareRegion(NamedTuple):
    """Ask for the run's shared region ``key`` of ``byte_size`` bytes (shared weights)."""

    key: str
    byte_size: int


class RegionFilled(NamedTuple):
    """The worker a RegionGrant told to fill ``key`` has (``ok``) or has given up."""

    key: str
    ok: bool


class Mapped(NamedTuple):
    """The worker has opened these clients' CUDA regions (sent before the results of the
    requests that opened them): a CUDA region's unregister waits for the workers that did."""

    refs: Sequence[str]


class Unmapped(NamedTuple):
    """The worker has closed its mappings of these client regions (an Execute's or a Free's
    ``unmap``): a CUDA region's unregister is answered only then."""

    refs: Sequence[str]


class LaneClosed(NamedTuple):
    """The worker serves lane ``lane`` no more (told to, or it could not: ``error``); it
    answered every request it had claimed and freed the lane's outputs, except, when told
    not to free them (LaneClose), those its client still holds: ``kept``, (offset, byte
    size) in its output region, which the broker makes the client's leases."""

    lane: int
    error: ErrorObject | None = None
    kept: tuple[tuple[int, int], ...] = ()


class LanePart(NamedTuple):
    """What one lane of an ensemble's step served (in its LaneStats too): the broker counts
    it for the ensemble."""

    lane: int
    success: int
    fail: int
    success_ns: int
    fail_ns: int
    queue_ns: int
    inferences: int
    durations: Durations


class LaneStats(NamedTuple):
    """What the worker's lanes served since its last LaneStats (lanes bypass the broker)."""

    success: int
    fail: int
    success_ns: int  # from the client's send to the response, summed
    fail_ns: int
    queue_ns: int  # from the client's send until the worker took them, summed (successes)
    inferences: int  # batch sizes of the successful requests, summed
    durations: Durations  # of the successful requests, summed
    batches: Sequence[LaneBatch]
    metrics: MetricsUpdate | None = None
    parts: Sequence[LanePart] = ()  # the lanes of ensembles' steps, each on its own
    # (lane, output bytes its client holds now) of the lanes whose count changed
    held: Sequence[tuple[int, int]] = ()
    # traced requests (LaneTracing): (request id, client's send, exec start, compute start,
    # compute end, exec end, answered), monotonic ns
    traces: Sequence[tuple[int, int, int, int, int, int, int]] = ()


class Traced(NamedTuple):
    """The instants of the executions of traced requests (``FLAG_TRACE``), sent before
    their results' Done: (rid, exec start, compute start, compute end, exec end) each."""

    stamps: Sequence[tuple[int, int, int, int, int]]


class Call(NamedTuple):
    """A model's inference request to a served model (BLS), made while it executes.

    ``work.rid`` is the worker's own number for the call (its Replies name it), and
    ``work.inputs`` lie in shared memory the broker's run knows (the arena, output regions,
    client regions).  ``model_version`` -1 is the highest ready version; ``timeout_us`` 0
    is none; a ``decoupled`` call accepts any number of responses.  ``held``: the execute
    that makes the call serves a lane, which the broker did not schedule: the instance is
    taken until the call ends, and must not be handed the call (or any batch) meanwhile.
    ``parent``: the rid of the request the model passed as the call's trace (Triton's
    ``trace=request.trace()``; 0: none): if that request is traced, so is the call.
    """

    model_name: str
    model_version: int
    work: Work
    timeout_us: int
    decoupled: bool
    held: bool
    parent: int = 0


class CancelCall(NamedTuple):
    """The model has given up on one of its calls (a decoupled call's ``cancel()``): the
    called request leaves its queue, or its backend sees ``is_cancelled()``."""

    call: int  # the call's ``work.rid``


class Query(NamedTuple):
    """What the broker knows of a served model (Triton's ``TRITONSERVER_ServerModel*``
    calls from a C backend): answered by one final Result of the Replies whose ``rid`` is
    ``call``, with ``parameters`` {"ready", "decoupled", "max_batch_size", "version",
    "config", "metadata"} (the last two JSON texts) and, when ``labels`` asks, "labels" (its
    outputs' labels: {output: [label by class index]}), or the error Triton gives for that
    model."""

    call: int  # the worker's own number for the query, as a Call's ``work.rid``
    model_name: str
    model_version: int  # -1: the highest ready version
    labels: bool = False


class Release(NamedTuple):
    """Reply output slots (of Replies) the worker has finished reading."""

    slots: Sequence[Slot]


BrokerMessage = (
    Execute | Free | Stop | RegionGrant | Replies | LaneOpen | LaneClose | LogChange | LaneTracing
)
WorkerMessage = (
    Ready
    | Failed
    | Items
    | Done
    | ShareRegion
    | RegionFilled
    | Mapped
    | Unmapped
    | Call
    | CancelCall
    | Query
    | Release
    | LaneClosed
    | LaneStats
    | Traced
)
Message = BrokerMessage | WorkerMessage

_KINDS: dict[type, Kind] = {
    Execute: Kind.EXECUTE,
    Free: Kind.FREE,
    Stop: Kind.STOP,
    RegionGrant: Kind.REGION_GRANT,
    Ready: Kind.READY,
    Failed: Kind.FAILED,
    Items: Kind.ITEMS,
    Done: Kind.DONE,
    ShareRegion: Kind.SHARE_REGION,
    RegionFilled: Kind.REGION_FILLED,
    Mapped: Kind.MAPPED,
    Unmapped: Kind.UNMAPPED,
    LaneOpen: Kind.LANE_OPEN,
    LaneClose: Kind.LANE_CLOSE,
    LaneClosed: Kind.LANE_CLOSED,
    LaneStats: Kind.LANE_STATS,
    Call: Kind.CALL,
    CancelCall: Kind.CANCEL_CALL,
    Query: Kind.QUERY,
    Replies: Kind.REPLIES,
    Release: Kind.RELEASE,
    LogChange: Kind.LOG_CHANGE,
    Traced: Kind.TRACED,
    LaneTracing: Kind.LANE_TRACING,
}


# ---------------------------------------------------------------------------- encoding
def _fields(obj: Any) -> tuple[Any, ...]:
    """orjson's fallback: a record (a NamedTuple) is the array of its fields."""
    if isinstance(obj, tuple):
        return tuple(obj)
    raise TypeError(f"{type(obj).__name__} cannot travel on a worker channel")


def encode(msg: Message) -> bytes:
    """A message as the bytes of one datagram."""
    # (the message as a plain tuple: orjson writes it without calling back into Python)
    return orjson.dumps((_KINDS[type(msg)], tuple(msg)), default=_fields)


def record_size(record: Any) -> int:
    """The bytes ``record`` (or any value of a message) takes inside an encoded message."""
    return len(orjson.dumps(record, default=_fields))


def encoded(record: tuple[Any, ...]) -> tuple[orjson.Fragment, int]:
    """``record`` encoded once, to travel in messages as is, and its size there: a request's
    Work is sized at admission and sent as it was sized."""
    data = orjson.dumps(tuple(record), default=_fields)
    return orjson.Fragment(data), len(data)


# An Execute is its frame plus its work items, each followed by a comma but the last: a
# batch whose items' sizes (+1 each) stay within BATCH_BYTES fits in a message (a direct
# sequence batch counts its null positions, ``len(str(i)) + 1`` each, in it too).
BATCH_BYTES = MAX_MESSAGE - len(encode(Execute([])))


def split(msg: Execute | Free) -> list[Execute | Free]:
    """``msg`` as messages that each fit in a datagram, in the order to send them: its
    slots, unmaps and releases go ahead in Free messages (the worker handles them before
    the batch, as it would have), halved until each fits.  An Execute's requests are not
    split: the batchers keep them within BATCH_BYTES."""
    lead = Free(msg.free, msg.unmap, msg.release)
    parts = _halves(lead)
    if isinstance(msg, Execute):
        parts.append(Execute(msg.requests, nulls=msg.nulls))
    return parts


def _halves(msg: Free) -> list[Execute | Free]:
    count = len(msg.free) + len(msg.unmap) + len(msg.release)
    if count <= 1 or len(encode(msg)) <= MAX_MESSAGE:
        return [msg] if count else []
    first: list[Sequence[Any]] = []
    second: list[Sequence[Any]] = []
    left = count // 2  # the first half of the items, lists in order
    for part in msg:
        take = min(left, len(part))
        left -= take
        first.append(part[:take])
        second.append(part[take:])
    return _halves(Free(*first)) + _halves(Free(*second))


# ---------------------------------------------------------------------------- decoding
# Records are built with tuple.__new__ (no Python-level __new__ per record); unpacking a
# composite record by its field names checks its arity, ``_make`` checks a leaf's.
_new = tuple.__new__
_ref = TensorRef._make
_window = Window._make
_slot = Slot._make
_durations = Durations._make


def _wanted(raw: Sequence[Any]) -> WantedOutput:
    name, window = raw
    return _new(WantedOutput, (name, None if window is None else _window(window)))


def _work(raw: Sequence[Any]) -> Work:
    rid, id_, correlation_id, flags, parameters, inputs, outputs, priority, timeout_us = raw
    inputs = list(map(_ref, inputs))
    outputs = [*map(_wanted, outputs)]
    return _new(
        Work, (rid, id_, correlation_id, flags, parameters, inputs, outputs, priority, timeout_us)
    )


def _result(raw: Sequence[Any]) -> Result:
    rid, final, outputs, parameters, error, durations = raw
    if outputs:
        outputs = list(map(_ref, outputs))
    if durations is not None:  # (a wrong arity goes to _make, which refuses it)
        durations = _new(Durations, durations) if len(durations) == 3 else _durations(durations)
    return _new(Result, (rid, final, outputs, parameters, error, durations))


def _batch(raw: Sequence[Any]) -> BatchStats:
    batch_size, durations = raw
    durations = _new(Durations, durations) if len(durations) == 3 else _durations(durations)
    return _new(BatchStats, (batch_size, durations))


def _execute(body: Sequence[Any]) -> Execute:
    requests, free, unmap, release, nulls = body
    if free:
        free = list(map(_slot, free))
    return _new(Execute, (list(map(_work, requests)), free, unmap, release, nulls))


def _free(body: Sequence[Any]) -> Free:
    free, unmap, release = body
    return _new(Free, (list(map(_slot, free)), unmap, release))


def _done(body: Sequence[Any]) -> Done:
    items, batches, metrics = body
    if metrics is not None:
        metrics = _metrics(metrics)
    return _new(Done, (list(map(_result, items)), list(map(_batch, batches)), metrics))


def _metrics(raw: Sequence[Any] | None) -> MetricsUpdate | None:
    if raw is None:
        return None
    families, ops = raw
    families = list(map(MetricFamilyInfo._make, families))
    return _new(MetricsUpdate, (families, list(map(MetricOp._make, ops))))


def _lane_batch(raw: Sequence[Any]) -> LaneBatch:
    batch_size, executions, durations = raw
    return _new(LaneBatch, (batch_size, executions, _durations(durations)))


def _lane_stats(body: Sequence[Any]) -> LaneStats:
    success, fail, success_ns, fail_ns, queue_ns, inferences, durations, batches, metrics = body[:9]
    fields = (success, fail, success_ns, fail_ns, queue_ns, inferences, _durations(durations))
    parts = tuple(_new(LanePart, (*p[:7], _durations(p[7]))) for p in body[9])
    held = tuple((lane, nbytes) for lane, nbytes in body[10])
    if not all(_all(int, *h) for h in held):
        raise ValueError("held output bytes of the wrong types")
    traces = tuple(tuple(t) for t in body[11])
    if not all(len(t) == 7 and _all(int, *t) for t in traces):
        raise ValueError("lane trace instants of the wrong shape or types")
    batches = list(map(_lane_batch, batches))
    return _new(LaneStats, (*fields, batches, _metrics(metrics), parts, held, traces))


def _ready(body: Sequence[Any]) -> Ready:
    placement, config, memory = body
    return _new(Ready, (placement, config, list(map(MemoryUsage._make, memory))))


def _items(body: Sequence[Any]) -> Items:
    (items,) = body
    return _new(Items, (list(map(_result, items)),))


def _replies(body: Sequence[Any]) -> Replies:
    (items,) = body
    return _new(Replies, (list(map(_result, items)),))


def _call(body: Sequence[Any]) -> Call:
    """A worker's call, its types checked: the broker acts on every field of it."""
    model_name, model_version, work, timeout_us, decoupled, held, parent = body
    fields = (model_name, model_version, _work(work), timeout_us, decoupled, held, parent)
    call = _new(Call, fields)
    w = call.work
    if not (
        _all(str, model_name, w.id)
        and _all(int, model_version, timeout_us, w.rid, w.flags, parent)
        and _all(bool, decoupled, held)
        and isinstance(w.correlation_id, int | str)
        and isinstance(w.parameters, dict)
        and all(_all(str, o.name) and o.window is None for o in w.outputs)
        and all(_tensor_ref(r) for r in w.inputs)
    ):
        raise ValueError("a call with fields of the wrong types")
    return call


def _cancel_call(body: Sequence[Any]) -> CancelCall:
    cancel = CancelCall._make(body)
    if not _all(int, cancel.call):
        raise ValueError("a call number that is not an integer")
    return cancel


def _query(body: Sequence[Any]) -> Query:
    query = Query._make(body)
    if not (
        _all(int, query.call, query.model_version)
        and _all(str, query.model_name)
        and isinstance(query.labels, bool)
    ):
        raise ValueError("a query with fields of the wrong types")
    return query


def _release(body: Sequence[Any]) -> Release:
    (slots,) = body
    release = _new(Release, (list(map(_slot, slots)),))
    if not all(_all(str, s.region) and _all(int, s.offset) for s in release.slots):
        raise ValueError("a slot with fields of the wrong types")
    return release


def _traced(body: Sequence[Any]) -> Traced:
    (stamps,) = body
    traced = _new(Traced, ([tuple(s) for s in stamps],))
    if not all(len(s) == 5 and _all(int, *s) for s in traced.stamps):
        raise ValueError("trace instants of the wrong shape or types")
    return traced


def _lane_closed(body: Sequence[Any]) -> LaneClosed:
    lane, error, kept = body
    closed = _new(LaneClosed, (lane, error, tuple((k[0], k[1]) for k in kept)))
    if not (_all(int, lane) and all(_all(int, *k) for k in closed.kept)):
        raise ValueError("a closed lane with fields of the wrong types")
    return closed


def _all(kind: type, *values: Any) -> bool:
    return all(type(v) is kind for v in values)  # as orjson reads them: a bool is no int


def _tensor_ref(ref: TensorRef) -> bool:
    return (
        _all(str, ref.name, ref.datatype, ref.region)
        and _all(int, ref.offset, ref.byte_size, *ref.shape)
        and isinstance(ref.shape, list)
    )


FROM_BROKER: dict[str, Callable[[Any], Any]] = {
    Kind.EXECUTE: _execute,
    Kind.FREE: _free,
    Kind.STOP: Stop._make,
    Kind.REGION_GRANT: RegionGrant._make,
    Kind.LANE_OPEN: lambda body: _new(LaneOpen, (*body[:5], tuple(body[5]), body[6])),
    Kind.LANE_CLOSE: LaneClose._make,
    Kind.REPLIES: _replies,
    Kind.LOG_CHANGE: LogChange._make,
    Kind.LANE_TRACING: LaneTracing._make,
}
_FROM_WORKER: dict[str, Callable[[Any], Any]] = {
    Kind.READY: _ready,
    Kind.FAILED: Failed._make,
    Kind.ITEMS: _items,
    Kind.DONE: _done,
    Kind.SHARE_REGION: ShareRegion._make,
    Kind.REGION_FILLED: RegionFilled._make,
    Kind.MAPPED: Mapped._make,
    Kind.UNMAPPED: Unmapped._make,
    Kind.LANE_CLOSED: _lane_closed,
    Kind.LANE_STATS: _lane_stats,
    Kind.CALL: _call,
    Kind.CANCEL_CALL: _cancel_call,
    Kind.QUERY: _query,
    Kind.RELEASE: _release,
    Kind.TRACED: _traced,
}


def decode(table: dict[str, Callable[[Any], Any]], sender: str, data: bytes | memoryview) -> Any:
    """The message ``data`` by the kinds of ``table``; INTERNAL naming ``sender`` if it is
    not one."""
    try:
        kind, body = orjson.loads(data)
        return table[kind](body)
    except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError is a ValueError
        raise InferpoolError(
            Code.INTERNAL, f"unreadable message from the {sender}: {type(exc).__name__}: {exc}"
        ) from None


def decode_from_broker(data: bytes | memoryview) -> BrokerMessage:
    """A message the broker sent; INTERNAL if it is not one."""
    msg: BrokerMessage = decode(FROM_BROKER, "broker", data)
    return msg


def decode_from_worker(data: bytes | memoryview) -> WorkerMessage:
    """A message a worker sent; INTERNAL if it is not one."""
    msg: WorkerMessage = decode(_FROM_WORKER, "worker", data)
    return msg
