"""Output slots with several owners (an ensemble's tensor read by two steps and sent to the
client): the slot goes back to its worker with the last owner's free, and a retired region
stays until then; a region other workers read is reported when it goes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from inferpool.broker.pool.output_regions import OutputRegions
from inferpool.shm.region import exists
from inferpool.shm.runs import new_run_id
from inferpool.wire.worker.protocol import Slot


@pytest.fixture
def gone() -> list[str]:
    """The lent regions reported gone."""
    return []


@pytest.fixture
def outputs(gone: list[str]) -> Iterator[OutputRegions]:
    regions = OutputRegions(new_run_id(), 1 << 16, prefault=False, lent_gone=gone.append)
    yield regions
    regions.close()
    assert len(regions) == 0


def test_a_shared_slot_goes_back_with_its_last_owner(outputs: OutputRegions) -> None:
    name = outputs.create("out0g0", owner="worker")
    outputs.share(name, 64, 2)  # two readers beside the result's own owner
    outputs.free(name, 64, held=False)
    outputs.free(name, 64, held=False)
    assert outputs.take_frees(name) == []  # one owner left
    outputs.free(name, 64, held=False)
    assert outputs.take_frees(name) == [Slot(name, 64)]
    outputs.free(name, 128, held=False)  # a slot nobody shared goes back at once
    assert outputs.take_frees(name) == [Slot(name, 128)]


def test_a_retired_region_stays_while_a_shared_slot_is_owned(
    outputs: OutputRegions, gone: list[str]
) -> None:
    name = outputs.create("out1g0", owner="worker")
    outputs.lend(name)
    outputs.share(name, 0, 1)
    outputs.retire(name)  # its worker exited
    assert exists(name) and gone == []
    outputs.free(name, 0, held=False)  # the extra owner: the region is held no more
    assert not exists(name) and gone == [name]
    outputs.free(name, 0, held=False)  # the last owner of a region already gone: nothing
    unlent = outputs.create("out2g0", owner="worker")
    outputs.retire(unlent)
    assert not exists(unlent) and gone == [name]  # nobody else read it: nothing to report
