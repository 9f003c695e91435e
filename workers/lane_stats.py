"""What a worker's lanes served, folded until it is sent to the broker as one LaneStats.

Lane requests never pass the broker, so their statistics travel on their own: a few
integers per request kept here (under a lock: every lane has its thread) and folded when
they are sent, one message for many requests.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from inferpool.wire.worker.protocol import (
    Durations,
    LaneBatch,
    LanePart,
    LaneStats,
    MetricsUpdate,
)

# an executed request as ``Tally.add`` keeps it until it is folded (the last field: its lane,
# if that lane serves an ensemble's step, else 0)
Row = tuple[bool, int, int, int, "Sequence[int] | None", "Sequence[Batch]", int, int]
Batch = tuple[int, Sequence[int]]  # a batch its backend reported: size, its four instants


class Tally:
    """What a worker's lanes served, folded until it is sent to the broker, and the
    requests they traced."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.trace_rate = 0  # every trace_rate-th request is traced (LaneTracing; 0: none)
        self._seen = 0  # requests served since the rate was set
        self._reset()

    def _reset(self) -> None:
        self.pending = False
        self.rows: list[Row] = []  # executed requests not folded yet (``add``)
        self.success = self.fail = self.success_ns = self.fail_ns = self.queue_ns = 0
        self.inferences = 0
        self.durations = [0, 0, 0]
        self.batches: dict[int, list[int]] = {}  # size -> [count, input, infer, output]
        # an ensemble step's lane -> [success, fail, success ns, fail ns, queue ns,
        # inferences, compute input, infer, output]
        self.parts: dict[int, list[int]] = {}
        self.traces: list[tuple[int, int, int, int, int, int, int]] = []  # LaneStats.traces

    def add(
        self,
        ok: bool,
        total_ns: int,
        queue_ns: int,
        batch_size: int,
        stamps: Sequence[int] | None,
        batches: Sequence[Batch],
        exec_ns: int,
        part: int = 0,
    ) -> None:
        """One executed lane request: ``stamps``, the four instants its backend reported
        (``backends.metrics.Timestamps``), if it did; ``batches``, what the backend reported
        of its batch, if anything (its size and four instants); ``exec_ns``, how long it
        executed as the worker saw it; ``part``: its lane, if that serves an ensemble's step
        (counted apart as well).  Kept as it is and folded when taken: a lane thread answers
        its next request sooner."""
        row = (ok, total_ns, queue_ns, batch_size, stamps, batches, exec_ns, part)
        with self._lock:
            self.pending = True
            self.rows.append(row)

    def trace(self, request_id: int, sent: int, instants: Sequence[int], end: int) -> None:
        """A request served (``sent`` by its client, executed over ``instants``, answered at
        ``end``): kept for the broker's trace if it is the rate-th."""
        with self._lock:
            self._seen += 1
            if self.trace_rate and self._seen % self.trace_rate == 0:
                self.pending = True
                start, compute_start, compute_end, exec_end = instants
                self.traces.append(
                    (request_id, sent, start, compute_start, compute_end, exec_end, end)
                )

    def trace_every(self, rate: int) -> None:
        """LaneTracing: sample from now on (the count starts over, as a setting's does)."""
        with self._lock:
            self.trace_rate, self._seen = rate, 0

    def _fold(self) -> None:
        """Fold the rows added since the last take into the sums."""
        for ok, total_ns, queue_ns, batch_size, stamps, batches, exec_ns, part in self.rows:
            if not ok:
                self.fail += 1
                self.fail_ns += total_ns
                if part:
                    self._part(part, 1, 0)[3] += total_ns
            else:
                self.success += 1
                self.success_ns += total_ns
                self.queue_ns += queue_ns
                self.inferences += batch_size
                if stamps is not None:
                    exec_start, compute_start, compute_end, exec_end = stamps
                    ci, cf, co = (
                        compute_start - exec_start,
                        compute_end - compute_start,
                        exec_end - compute_end,
                    )
                else:
                    ci, cf, co = 0, exec_ns, 0
                sums = self.durations
                sums[0] += ci
                sums[1] += cf
                sums[2] += co
                if part:
                    row = self._part(part, 0, 1)
                    row[2] += total_ns
                    row[4] += queue_ns
                    row[5] += batch_size
                    row[6] += ci
                    row[7] += cf
                    row[8] += co
            if not batches:
                self._batch(batch_size, 0, exec_ns, 0)
            for size, (start, compute_start, compute_end, end) in batches:
                self._batch(
                    size, compute_start - start, compute_end - compute_start, end - compute_end
                )

    def _batch(self, size: int, compute_input: int, compute_infer: int, output: int) -> None:
        entry = self.batches.get(size)
        if entry is None:
            entry = self.batches[size] = [0, 0, 0, 0]
        entry[0] += 1
        entry[1] += compute_input
        entry[2] += compute_infer
        entry[3] += output

    def _part(self, lane: int, fail: int, success: int) -> list[int]:
        row = self.parts.get(lane)
        if row is None:
            row = self.parts[lane] = [0] * 9
        row[0] += success
        row[1] += fail
        return row

    def fail_one(self, total_ns: int, part: int = 0) -> None:
        """A lane request refused before it ran (malformed, invalid inputs)."""
        with self._lock:
            self.pending = True
            self.fail += 1
            self.fail_ns += total_ns
            if part:
                self._part(part, 1, 0)[3] += total_ns

    def take(
        self, metrics: MetricsUpdate | None, held: Sequence[tuple[int, int]] = ()
    ) -> LaneStats | None:
        """Everything since the last take, with ``held`` (lanes whose clients' held output
        bytes changed), or None if nothing happened."""
        with self._lock:
            if not self.pending and metrics is None and not held:
                return None
            self._fold()
            stats = LaneStats(
                self.success,
                self.fail,
                self.success_ns,
                self.fail_ns,
                self.queue_ns,
                self.inferences,
                Durations(*self.durations),
                [LaneBatch(size, e[0], Durations(*e[1:])) for size, e in self.batches.items()],
                metrics,
                tuple(_part(lane, p) for lane, p in self.parts.items()),
                held,
                tuple(self.traces),
            )
            self._reset()
            return stats


def _part(lane: int, sums: list[int]) -> LanePart:
    success, fail, success_ns, fail_ns, queue_ns, inferences, ci, cf, co = sums
    durations = Durations(ci, cf, co)
    return LanePart(lane, success, fail, success_ns, fail_ns, queue_ns, inferences, durations)
