"""A worker's lane statistics (workers/lane_stats.py): rows kept as added, folded when taken."""

from __future__ import annotations

from inferpool.wire.worker.messages import Durations, LaneBatch
from inferpool.workers.lane_stats import Tally


def test_rows_fold_into_the_broker_s_sums_when_taken() -> None:
    tally = Tally()
    assert tally.take(None) is None
    # reported by the backend: the request's instants and its batch's (size 2)
    tally.add(True, 50, 5, 2, (100, 110, 140, 145), [(2, (100, 110, 140, 145))], 45)
    tally.add(True, 30, 3, 1, None, [], 20)  # nothing reported: its execution is its infer
    tally.add(False, 7, 1, 1, None, [], 6)
    tally.fail_one(9)
    assert tally.pending
    stats = tally.take(None)
    assert stats is not None
    assert (stats.success, stats.fail, stats.success_ns, stats.fail_ns) == (2, 2, 80, 16)
    assert (stats.queue_ns, stats.inferences) == (8, 3)
    assert stats.durations == Durations(10, 30 + 20, 5)
    assert sorted(stats.batches) == [
        LaneBatch(1, 2, Durations(0, 26, 0)),
        LaneBatch(2, 1, Durations(10, 30, 5)),
    ]
    assert tally.take(None) is None and not tally.pending
