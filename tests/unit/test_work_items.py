"""A worker's plans for like batches: a repeated record is decoded once (wire/worker/reader.py)
and its request's inputs worked out once (workers/work_items.py), and neither ever
serves what another record, a retired region or a shrunk object would have given."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest

from inferpool.backends.api import RequestedOutput
from inferpool.shm.refs import system_ref
from inferpool.shm.region import Region
from inferpool.wire.errors import InferpoolError
from inferpool.wire.worker import protocol as m
from inferpool.wire.worker.reader import BrokerReader
from inferpool.workers.memory import WorkerMemory
from inferpool.workers.work_items import RequestPlans
from tests.unit.test_worker_protocol import FROM_BROKER, _record_types

ARENA = "inferpool-0123456789-arena"


def work(rid: int, offset: int = 0, shape: list[int] | None = None, region: str = ARENA) -> m.Work:
    ref = m.TensorRef("INPUT0", "UINT8", shape or [1, 4], region, offset, 4)
    return m.Work(rid, str(rid), 0, 0, {}, [ref], [m.WantedOutput("OUTPUT0")])


def execute(*works: m.Work, free: list[m.Slot] | None = None) -> bytes:
    return m.encode(m.Execute(list(works), free or []))


@pytest.mark.parametrize("msg", FROM_BROKER, ids=lambda msg: type(msg).__name__)
def test_the_reader_decodes_what_decode_from_broker_does(msg: m.BrokerMessage) -> None:
    read = BrokerReader().decode
    for _ in range(2):  # decoded afresh, then from what the first decoding made
        back = read(m.encode(msg))
        assert back == msg == m.decode_from_broker(m.encode(msg))
        assert _record_types(back) == _record_types(msg)


def test_a_repeated_record_is_decoded_to_the_same_objects() -> None:
    read = BrokerReader().decode
    slot = [m.Slot("inferpool-0123456789-out0g0", 64)]
    first = read(execute(work(1), work(2), free=slot))
    second = read(execute(work(3), free=slot))
    assert isinstance(first, m.Execute) and isinstance(second, m.Execute)
    a, b, c = *first.requests, *second.requests
    assert a.inputs is b.inputs is c.inputs and a.outputs is b.outputs is c.outputs
    assert first.free is second.free and second.free == slot
    assert (a.rid, a.id, c.rid, c.id) == (1, "1", 3, "3")


def test_a_record_that_differs_in_anything_is_decoded_afresh() -> None:
    read = BrokerReader().decode
    first = read(execute(work(1)))
    assert isinstance(first, m.Execute)
    seen = first.requests[0].inputs
    for other in (work(2, offset=8), work(3, shape=[4, 1]), work(4, region=ARENA + "x")):
        msg = read(execute(other))
        assert isinstance(msg, m.Execute)
        inputs = msg.requests[0].inputs
        assert inputs is not seen and inputs == other.inputs  # never the last one's
        seen = inputs
    windowed = work(5)._replace(outputs=[m.WantedOutput("OUTPUT0", m.Window("ref", 0, 4))])
    msg = read(execute(windowed))
    assert isinstance(msg, m.Execute) and msg.requests[0].outputs == windowed.outputs
    msg = read(execute(work(5, offset=8), free=[m.Slot("r", 1)]))
    again = read(execute(work(6, offset=8), free=[m.Slot("r", 2)]))
    assert isinstance(msg, m.Execute) and isinstance(again, m.Execute)
    assert again.free == [m.Slot("r", 2)]


@pytest.fixture
def memory() -> Iterator[WorkerMemory]:
    out = Region.create(f"inferpool-test-plans-{os.getpid()}", 1 << 20, prefault=False)
    mem = WorkerMemory(out.name, "test_0")
    yield mem
    mem.close()
    out.destroy()


@pytest.fixture
def arena() -> Iterator[Region]:
    reg = Region.create(f"inferpool-test-plans-in-{os.getpid()}", 8192, prefault=False)
    reg.buf[0:16] = bytes(range(16))
    yield reg
    reg.destroy()


def plans_of(memory: WorkerMemory) -> RequestPlans:
    return RequestPlans(memory, {}, True, {"OUTPUT0": RequestedOutput("OUTPUT0")})


def test_like_items_share_their_inputs_views_in_dicts_of_their_own(
    memory: WorkerMemory, arena: Region
) -> None:
    plans = plans_of(memory)
    read = BrokerReader().decode
    msg = read(execute(work(1, region=arena.name), work(2, region=arena.name)))
    assert isinstance(msg, m.Execute)
    (inputs, wanted), (again, wanted_again) = (plans.of(w) for w in msg.requests)
    assert inputs is not again and wanted is not wanted_again
    assert inputs["INPUT0"] is again["INPUT0"]
    assert wanted["OUTPUT0"] is plans.shared["OUTPUT0"]
    assert inputs["INPUT0"].data.tolist() == [[0, 1, 2, 3]]
    other = read(execute(work(3, offset=4, region=arena.name)))
    assert isinstance(other, m.Execute)
    moved, _ = plans.of(other.requests[0])
    assert moved["INPUT0"].data.tolist() == [[4, 5, 6, 7]]


def test_an_unmap_drops_the_plans_so_a_region_mapped_again_is_read_afresh(
    memory: WorkerMemory, arena: Region
) -> None:
    plans = plans_of(memory)
    item = work(1, region=arena.name)
    before, _ = plans.of(item)
    memory.unmap([arena.name])
    after, _ = plans.of(item)  # the same records: only the unmap tells the plan is gone
    assert after["INPUT0"] is not before["INPUT0"]
    assert after["INPUT0"].data.tolist() == [[0, 1, 2, 3]]


def test_bytes_inputs_are_decoded_for_every_request(memory: WorkerMemory, arena: Region) -> None:
    arena.buf[0:6] = (2).to_bytes(4, "little") + b"ab"
    ref = m.TensorRef("INPUT0", "BYTES", [1], arena.name, 0, 6)
    item = m.Work(1, "1", 0, 0, {}, [ref], [m.WantedOutput("OUTPUT0")])
    plans = plans_of(memory)
    first, _ = plans.of(item)
    second, _ = plans.of(item)
    assert first["INPUT0"] is not second["INPUT0"]
    assert second["INPUT0"].data.tolist() == [b"ab"]


@pytest.fixture
def own_object() -> Iterator[tuple[str, int]]:
    name = f"test-plans-object-{os.getpid()}"
    fd = os.open(f"/dev/shm/{name}", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 8192)
    yield name, fd
    os.close(fd)
    os.unlink(f"/dev/shm/{name}")


def test_a_clients_window_is_checked_in_every_batch_that_reuses_a_plan(
    memory: WorkerMemory, own_object: tuple[str, int]
) -> None:
    name, fd = own_object
    os.pwrite(fd, np.arange(4, dtype=np.uint8).tobytes(), 64)
    st = os.fstat(fd)
    ref = system_ref(1, "/" + name, (st.st_dev, st.st_ino), 0, 4096)
    plans = plans_of(memory)
    item = work(1, offset=64, region=ref)
    memory.batch += 1
    inputs, _ = plans.of(item)
    assert inputs["INPUT0"].data.tolist() == [[0, 1, 2, 3]]
    os.ftruncate(fd, 0)  # the client shrinks its object
    memory.batch += 1
    with pytest.raises(InferpoolError, match="shrank"):
        plans.of(item)
    memory.unmap([ref])


def test_a_batch_of_one_like_the_last_is_that_batch_with_its_handle_and_id() -> None:
    read = BrokerReader().decode
    slot = [m.Slot("inferpool-0123456789-out0g0", 64)]
    first = read(execute(work(1), free=slot))
    tricky = work(2)._replace(id='2",0,0,{},[],[]]],[["x",1]],[],[],[]]]')  # an id of JSON
    for item in (work(2), tricky, work(12345678901234)):
        data = execute(item, free=slot)
        again, fresh = read(data), m.decode_from_broker(data)
        assert again == fresh and _record_types(again) == _record_types(fresh)
        assert isinstance(again, m.Execute) and isinstance(first, m.Execute)
        assert again.requests[0].inputs is first.requests[0].inputs  # not parsed again
        assert (again.requests[0].rid, again.requests[0].id) == (item.rid, item.id)


def test_a_batch_that_differs_after_its_id_is_read_in_full() -> None:
    read = BrokerReader().decode
    read(execute(work(1), free=[m.Slot("r", 0)]))
    others = [
        m.Execute([work(2)], [m.Slot("r", 8)]),  # another slot to free
        m.Execute([work(3, offset=64)], [m.Slot("r", 8)]),  # the input elsewhere
        m.Execute([work(4)._replace(flags=1)], [m.Slot("r", 8)]),
        m.Execute([work(5), work(6)], [m.Slot("r", 8)]),  # ends as the last batch of one did
        m.Execute([work(7)], [m.Slot("r", 8)], ["ref"]),
    ]
    for msg in others:
        back = read(m.encode(msg))
        assert isinstance(back, m.Execute)
        assert back == m.decode_from_broker(m.encode(msg)) and back.requests == msg.requests
    with_parameters = work(8)._replace(parameters={"p": [1]})
    first = read(execute(with_parameters))
    again = read(execute(with_parameters._replace(rid=9, id="9")))
    assert isinstance(first, m.Execute) and isinstance(again, m.Execute)
    assert again.requests[0].parameters == {"p": [1]}
    assert again.requests[0].parameters is not first.requests[0].parameters  # a backend's own
