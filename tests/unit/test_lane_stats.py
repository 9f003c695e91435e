"""A worker's lane statistics (workers/lane_stats.py): rows kept as added, folded when taken."""

from __future__ import annotations

from inferpool.wire.worker.protocol import Durations, LaneBatch, LanePart
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
    assert stats.parts == ()


def test_an_ensemble_step_s_lane_is_also_counted_on_its_own() -> None:
    tally = Tally()
    tally.add(True, 50, 5, 1, (100, 110, 140, 145), [], 45, part=7)
    tally.add(True, 30, 3, 1, None, [], 20)  # another lane: in the sums only
    tally.add(True, 40, 4, 2, None, [], 25, part=7)
    tally.add(False, 6, 1, 1, None, [], 5, part=8)
    tally.fail_one(9, part=8)
    stats = tally.take(None)
    assert stats is not None and (stats.success, stats.fail) == (3, 2)
    assert sorted(stats.parts) == [
        LanePart(7, 2, 0, 90, 0, 9, 3, Durations(10, 30 + 25, 5)),
        LanePart(8, 0, 2, 0, 15, 0, 0, Durations(0, 0, 0)),
    ]
    assert tally.take(None) is None
