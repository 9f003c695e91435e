"""The sequence batcher over drawn interleavings of sequences, instance completions,
cancellations and instances that stop (replaced by new ones), with the harness of
tests/unit/test_sequencer.py: whatever the order, each sequence runs in order on one
instance, one request per batch, no busy or stopped instance is given a batch, and once every
sequence has been sent to its end and every instance has finished, every request has run,
been refused or been given back as cancelled."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from inferpool.broker.models.request import PendingRequest
from tests.unit.test_sequencer import END, START, Instance, Recorder

STRATEGIES = ["", "oldest { max_candidate_sequences: 3 }"]
# a step: ("send", sequence) sends that sequence's next request (START first, END last),
# ("done", instance) finishes the instance's batch, ("cancel", sequence) cancels its last,
# ("gone", instance) stops the instance (its sequences are lost) and starts a new one
STEPS = st.lists(
    st.tuples(
        st.sampled_from(["send", "send", "send", "done", "done", "cancel", "gone"]),
        st.integers(0, 3),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(STRATEGIES),
    st.integers(1, 3),  # max_batch_size: the slots of an instance
    st.lists(st.integers(1, 4), min_size=4, max_size=4),  # each sequence's length
    STEPS,
)
def test_every_interleaving_keeps_each_sequence_whole(
    strategy: str, slots: int, lengths: list[int], steps: list[tuple[str, int]]
) -> None:
    r = Recorder(max_batch_size=slots, strategy=strategy)
    instances = [Instance(0, "a"), Instance(1, "b")]
    stopped: set[str] = set()
    busy: set[str] = set()
    sent = [0] * len(lengths)
    requests: dict[int, list[PendingRequest]] = {}
    ran: list[tuple[str, Any, int]] = []  # (instance, sequence, request's rid), in order
    cancelled: set[int] = set()  # rids the batcher gave back when cancelled

    def collect() -> None:
        for worker, batch, _ in r.dispatched:
            assert worker.name not in busy, f"{worker.name} was given a batch while busy"
            assert worker.name not in stopped, f"{worker.name} was given a batch once stopped"
            corrs = [req.work.correlation_id for req in batch]
            assert len(corrs) == len(set(corrs)), f"a sequence twice in one batch: {corrs}"
            busy.add(worker.name)
            ran.extend((worker.name, req.work.correlation_id, req.rid) for req in batch)
        r.dispatched.clear()

    def send(seq: int) -> None:
        n, length = sent[seq], lengths[seq]
        flags = (START if n == 0 else 0) | (END if n == length - 1 else 0)
        requests.setdefault(seq, []).append(r.submit(seq + 1, flags))
        sent[seq] = n + 1

    def done(worker: Instance) -> None:
        busy.discard(worker.name)
        r.seq.instance_idle(worker, 0)

    for worker in instances:
        r.seq.instance_idle(worker, 0)
    for kind, k in steps:
        if kind == "send" and sent[k] < lengths[k]:
            send(k)
        elif kind == "done" and instances[k % 2].name in busy:
            done(instances[k % 2])
        elif kind == "cancel" and requests.get(k):
            cancelled.update(req.rid for req in r.seq.cancel(requests[k][-1]))
        elif kind == "gone":
            old = instances[k % 2]
            r.seq.instance_gone(old)
            stopped.add(old.name)
            busy.discard(old.name)
            instances[k % 2] = Instance(old.slot, f"{old.name}'")
            r.seq.instance_idle(instances[k % 2], 0)
        collect()
    for seq in range(len(lengths)):  # every sequence sent to its end
        while sent[seq] < lengths[seq]:
            send(seq)
            collect()
    for _ in range(4 * sum(lengths) + 4):  # every instance finishing what it has
        for worker in instances:
            if worker.name in busy:
                done(worker)
        collect()
    if not busy:
        for worker in instances:
            done(worker)
        collect()

    ran_rids = [rid for _, _, rid in ran]
    assert len(ran_rids) == len(set(ran_rids)), "a request ran twice"
    assert not cancelled & set(ran_rids), "a request given back as cancelled ran"
    by_sequence: dict[Any, list[tuple[str, int]]] = {}
    for name, corr, rid in ran:
        by_sequence.setdefault(corr, []).append((name, rid))
    for corr, runs in by_sequence.items():
        rids = [rid for _, rid in runs]
        assert rids == sorted(rids), f"sequence {corr} ran out of order: {rids}"
        assert len({name for name, _ in runs}) == 1, f"sequence {corr} moved: {runs}"
    # every request ran, was refused, or was given back when cancelled; none is left
    assert len(ran_rids) + len(r.rejected) + len(cancelled) == sum(sent)
    assert not busy
