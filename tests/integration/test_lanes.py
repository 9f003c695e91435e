"""Lanes end to end: a real server, real workers, real rings in /dev/shm.

Requests go client -> worker through the lane and come back in place; the broker refuses
models lanes do not serve, counts what lanes served, and revokes lanes whose client, model
or instance ends, after which requests take the broker path.  A lane reads inputs only from
its client's own region: a request that names anything else is refused by the worker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import AsyncShmClient, Client, InferpoolError, ShmClient, ShmResult
from inferpool.client.lane import Lane
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from inferpool.wire.errors import Code
from tests.integration.test_metrics import scrape
from tests.support import Server, free_tcp_port, identity_config, wait_until, write_model

DELAY = 'parameters { key: "execute_delay_ms" value: { string_value: "600" } }'


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
    repo = tmp / "repo"
    write_model(repo, "plain", identity_config("plain"))
    write_model(repo, "batch", identity_config("batch", max_batch=8, dims="[ 2 ]"))
    write_model(repo, "dyn", identity_config("dyn", max_batch=8, extra="dynamic_batching { }"))
    write_model(repo, "slow", identity_config("slow", extra=DELAY))
    write_model(repo, "slow2", identity_config("slow2", extra=DELAY))
    write_model(repo, "gone", identity_config("gone"))
    reshaped = """
        name: "reshaped"
        backend: "identity"
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
    """
    write_model(repo, "reshaped", reshaped)
    write_model(repo, "cached", identity_config("cached", extra="response_cache { enable: true }"))
    write_model(repo, "again", identity_config("again"))
    write_model(repo, "strings", identity_config("strings", "TYPE_STRING"))
    args = ("--model-control-mode", "explicit", "--load-model", "*", "--lease-timeout", "2")
    args += ("--cache-size", "1M")  # type: ignore[assignment]
    port = free_tcp_port()
    try:
        with Server(tmp, repo, *args, "--metrics-port", str(port)) as srv:
            srv.metrics_port = port  # type: ignore[attr-defined]
            yield srv
        assert srv.proc.returncode == 0, srv.log()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def lane_stats(server: Server, model: str) -> dict[str, int]:
    with Client(server.endpoint, timeout=10) as c:
        stats: dict[str, int] = c.statistics(model)["model_stats"][0]["lane_stats"]
        return stats


def fp32_request(client: ShmClient, model: str, values: Any) -> Any:
    req = client.request(model, outputs=["OUTPUT0"])
    req.input("INPUT0", np.shape(values), np.float32)[:] = values
    return req


def served(client: ShmClient, model: str) -> None:
    """A request of ``model`` is answered (on a lane or on the broker path)."""
    with client.run(fp32_request(client, model, np.ones(2, np.float32))) as result:
        assert result["OUTPUT0"].tolist() == [1, 1]


# ---------------------------------------------------------------------------- serving
def test_a_lane_answers_in_place_and_is_counted(server: Server) -> None:
    before = lane_stats(server, "plain")["success"]
    with ShmClient(server.endpoint, lane=True, timeout=10) as c:
        assert "lanes" in c.server_metadata()["extensions"]
        req = fp32_request(c, "plain", np.arange(6, dtype=np.float32))
        for _ in range(5):
            with c.run(req) as result:
                assert np.array_equal(result["OUTPUT0"], np.arange(6))
                assert result.parameters["param1"] == 42  # the backend's parameters travel
                assert all(isinstance(t, int) for t in result.leases)  # lane tokens
        lane = c.lane("plain")
        assert isinstance(lane, Lane) and lane.usable and lane.model == "plain"
        assert c.session.lanes.lanes[("plain", "")] is lane
    wait_until(lambda: lane_stats(server, "plain")["success"] >= before + 5, "5 lane requests", 10)
    samples = scrape(server.metrics_port)  # type: ignore[attr-defined]
    labels = (("model", "plain"), ("outcome", "success"), ("version", "1"))
    assert samples[("inferpool_lane_requests", labels)] >= before + 5
    assert samples[("nv_inference_request_success", labels[:1] + labels[2:])] >= 5


def test_a_lane_tells_a_changed_response_from_the_last_one(server: Server) -> None:
    """Each end knows a record like its last one by its bytes: a response of another shape,
    or in another place, is read anew, and a result's parameters are its own."""
    with ShmClient(server.endpoint, lane=True, timeout=10) as c:
        for n in (6, 6, 3, 3, 6):  # released each time: the same place, twice the same
            values = np.arange(n, dtype=np.float32) + n
            with c.run(fp32_request(c, "plain", values)) as result:
                assert np.array_equal(result["OUTPUT0"], values)
                assert result.parameters["param1"] == 42
                result.parameters["param1"] = 0  # the next result's are not these
        held = c.run(fp32_request(c, "plain", np.ones(6, np.float32)))
        with c.run(fp32_request(c, "plain", np.zeros(6, np.float32))) as result:
            assert result.leases != held.leases  # the held output is elsewhere
            assert not result["OUTPUT0"].any() and held["OUTPUT0"].all()
        held.release()


def test_a_batching_model_takes_its_batch_dimension_on_a_lane(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        c.lane("batch")
        req = fp32_request(c, "batch", np.ones((3, 2), np.float32))
        with c.run(req) as result:
            assert result["OUTPUT0"].shape == (3, 2)


def test_a_reshaped_output_has_the_configs_dims_on_a_lane_too(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        req = fp32_request(c, "reshaped", np.arange(4, dtype=np.float32))
        with c.run(req) as result:
            broker = result["OUTPUT0"].copy()
        c.lane("reshaped")
        with c.run(req) as result:
            assert result["OUTPUT0"].shape == broker.shape == (4,)
            assert result["OUTPUT0"].tolist() == broker.tolist() == [0, 1, 2, 3]


def test_bytes_inputs_are_read_anew_for_every_request(server: Server) -> None:
    """The worker keeps a checked body's input views, but BYTES elements are decoded from
    the client's region each time: new bytes under the same body are what the backend sees."""
    with ShmClient(server.endpoint, timeout=10) as c:
        c.lane("strings")
        req = c.request("strings", outputs=["OUTPUT0"])
        req.set_input("INPUT0", np.array([b"abc"], dtype=object))
        with c.run(req) as result:
            assert result["OUTPUT0"].tolist() == [b"abc"]
        offset = req.header["inputs"][0]["parameters"]["shared_memory_offset"]
        assert c.session.region is not None
        c.session.region.buf[offset + 4 : offset + 7] = b"xyz"  # after its u32 length
        with c.run(req) as result:
            assert result["OUTPUT0"].tolist() == [b"xyz"]
        assert c.session.lanes.lanes[("strings", "")].sent == 2  # both went through the lane


@pytest.mark.parametrize(("model", "why"), [("dyn", "dynamic batching"), ("cached", "caches")])
def test_models_the_broker_batches_or_caches_are_refused(
    server: Server, model: str, why: str
) -> None:
    with ShmClient(server.endpoint, timeout=10) as c, pytest.raises(InferpoolError) as info:
        c.lane(model)
    assert info.value.code is Code.UNSUPPORTED and why in info.value.message


def test_models_that_batch_in_the_broker_are_refused(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        with pytest.raises(InferpoolError) as info:
            c.lane("dyn")
        assert info.value.code is Code.UNSUPPORTED
        assert "uses dynamic batching" in info.value.message
        assert "use the broker path" in info.value.message
    with ShmClient(server.endpoint, lane=True, timeout=10) as c:  # lanes where they serve
        req = fp32_request(c, "dyn", np.ones((1, 4), np.float32))
        for _ in range(2):
            with c.run(req) as result:  # the broker path, which batches
                assert result["OUTPUT0"].tolist() == [[1, 1, 1, 1]]
        assert c.session.lanes.unserved == {("dyn", "")} and len(c.session.lanes) == 0
        served(c, "plain")
        assert len(c.session.lanes) == 1  # a model lanes serve still gets its lane


def test_a_lane_needs_the_clients_input_region(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=0, timeout=10) as c:
        with pytest.raises(InferpoolError) as info:
            c.lane("plain")
        assert info.value.code is Code.INVALID_ARG
        assert "input region" in info.value.message


def test_bad_inputs_get_the_broker_paths_errors_and_the_lane_goes_on(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        on_lane = c.lane("plain")
        req = c.request("plain", outputs=["OUTPUT0"])
        req.input("INPUT0", (4,), np.int32)[:] = 1  # the model takes FP32
        with pytest.raises(InferpoolError) as lane_err:
            c.run(req)
        assert on_lane.usable
        c.close_lane("plain")
        with pytest.raises(InferpoolError) as broker_err:
            c.run(req)
        assert lane_err.value == broker_err.value
        assert "data-type is 'INT32'" in lane_err.value.message
        c.lane("plain")
        good = fp32_request(c, "plain", np.ones(3, np.float32))
        with c.run(good) as result:
            assert result["OUTPUT0"].tolist() == [1, 1, 1]


def raw_request(lane: Lane, inputs: list[wl.Tensor]) -> int:
    body = lr.pack_request_body(inputs, [0])
    return lane.post((body, len(inputs), 1))


def test_a_lane_reads_nothing_outside_the_clients_region(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 16, timeout=10) as c:
        lane = c.lane("plain")
        fp32 = wl.DATATYPES["FP32"]
        for offset, size in [(1 << 16, 16), ((1 << 16) - 8, 16), (1 << 40, 4)]:
            n = raw_request(lane, [wl.Tensor(0, fp32, offset, size, (size // 4,))])
            with pytest.raises(InferpoolError) as info:
                lane.result(n, 10)
            assert info.value.code is Code.INVALID_ARG
            assert "lies outside shared-memory region" in info.value.message
        n = raw_request(lane, [wl.Tensor(0, fp32, 0, 4096, (4,))])  # size and shape disagree
        with pytest.raises(InferpoolError, match="input byte size mismatch"):
            lane.result(n, 10)
        n = raw_request(lane, [wl.Tensor(7, fp32, 0, 16, (4,))])  # no such input
        with pytest.raises(InferpoolError, match="unexpected inference input"):
            lane.result(n, 10)
        lane.releases = [12345]  # a token the client was never given
        n = raw_request(lane, [wl.Tensor(0, fp32, 0, 16, (4,))])
        with pytest.raises(InferpoolError) as info:
            lane.result(n, 10)
        assert info.value.code is Code.NOT_FOUND
        token = lane.result(raw_request(lane, [wl.Tensor(0, fp32, 0, 16, (4,))]), 10).leases[0]
        lane.releases = [token, token]  # held once, given twice: freed once, the second refused
        with pytest.raises(InferpoolError, match=r"1 lease\(s\) not held.*1 other lease"):
            lane.result(raw_request(lane, [wl.Tensor(0, fp32, 0, 16, (4,))]), 10)
        lane.releases = [token]
        with pytest.raises(InferpoolError, match=r"lease\(s\) not held on this lane: \["):
            lane.result(raw_request(lane, [wl.Tensor(0, fp32, 0, 16, (4,))]), 10)
        assert lane.usable


def test_a_lane_writes_outputs_into_the_clients_region_only_where_asked(server: Server) -> None:
    """A window in the client's region takes the output when it fits it; one too small
    leaves the output in the worker's region (leased as usual); one outside the region is
    refused."""
    with ShmClient(server.endpoint, input_bytes=1 << 16, timeout=10) as c:
        lane = c.lane("plain")
        fp32 = wl.DATATYPES["FP32"]
        own = c.session.region
        np.frombuffer(own.buf, np.float32, 4, 0)[:] = [1, 2, 3, 4]
        data = [wl.Tensor(0, fp32, 0, 16, (4,))]

        def placed(window: tuple[int, int]) -> Any:
            body = lr.pack_request_body(data, [0], {0: window})
            return lane.result(lane.post((body, 1, 1)), 10)

        result = placed((4096, 16))
        assert result.leases == [] and result.layout[0][-1] is True
        assert np.frombuffer(own.buf, np.float32, 4, 4096).tolist() == [1, 2, 3, 4]
        assert result["OUTPUT0"].tolist() == [1, 2, 3, 4]
        result = placed((8192, 8))  # too small: the worker's region, as without a window
        assert result.layout[0][-1] is False and len(result.leases) == 1
        assert np.frombuffer(own.buf, np.float32, 2, 8192).tolist() == [0, 0]
        result.release()
        for window in [(1 << 16, 16), ((1 << 16) - 8, 16), (1 << 40, 4)]:
            with pytest.raises(InferpoolError) as info:
                placed(window)
            assert info.value.code is Code.INVALID_ARG
            assert "the window of output 'OUTPUT0' lies outside shared-memory region" in (
                info.value.message
            )
        assert lane.usable and not lane.releases  # the lease went back with a request
        assert placed((4096, 16))["OUTPUT0"].tolist() == [1, 2, 3, 4]


def test_a_malformed_slot_is_refused(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        lane = c.lane("plain")
        body = lr.pack_request_body([wl.Tensor(0, 11, 0, 16, (4,))], [0])
        n = lane.post((body, 200, 1))  # 200 inputs announced, one there
        with pytest.raises(InferpoolError, match="malformed lane request"):
            lane.result(n, 10)
        served(c, "plain")


def test_lane_outputs_are_released_with_the_next_request(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        lane = c.lane("plain")
        req = fp32_request(c, "plain", np.ones(1024, np.float32))
        held = [c.run(req) for _ in range(3)]
        tokens = [t for r in held for t in r.leases]
        assert len(set(tokens)) == 3  # three outputs alive at once, each its own slot
        for r in held:
            r.release()
        assert sorted(lane.releases) == sorted(tokens)
        assert c.flush() == 3
        assert lane.releases == []


def test_the_asyncio_client_keeps_many_requests_in_flight_on_a_lane(server: Server) -> None:
    async def main() -> list[float]:
        async with AsyncShmClient(server.endpoint, lane=True, timeout=10) as c:
            reqs = []
            for i in range(12):
                req = c.request("plain", outputs=["OUTPUT0"])
                req.input("INPUT0", (3,), np.float32)[:] = i
                reqs.append(req)

            async def one(req: Any) -> float:
                with await c.run(req) as result:
                    return float(result["OUTPUT0"][0])

            got = await asyncio.gather(*(one(r) for r in reqs * 3))
            assert len(c.session.lanes) == 1
            return got

    assert asyncio.run(main()) == [float(i) for i in range(12)] * 3


# ---------------------------------------------------------------------------- revocation
def lane_regions(server: Server) -> list[str]:
    return [r for r in server.regions() if "-lane" in r]


def test_a_lane_revoked_by_the_broker_sends_requests_through_it(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        lane = c.lane("plain")
        c.call("close_lane", lane=lane.id)  # as the broker would revoke it
        wait_until(lambda: lane.header[wl.WORKER_CLOSED], "the worker closes it", 10)
        assert not lane.usable
        assert lane.header.reason() == ("CANCELLED", "the client closed the lane")
        served(c, "plain")
        assert not c.session.lanes.lanes  # the ended lane was forgotten
    wait_until(lambda: not lane_regions(server), "lane regions unlinked", 10)


def test_requests_waiting_on_a_revoked_lane(server: Server) -> None:
    """The model unloads while the worker runs one lane request and another waits: the one
    it took is answered on the lane (its outputs stay readable), the one it had not taken
    never runs there and goes the broker path, which says the model is unloading or gone."""

    async def main() -> list[Any]:
        async with AsyncShmClient(server.endpoint, timeout=20) as c:
            lane = await c.lane("slow2")
            reqs = []
            for i in range(2):
                req = c.request("slow2", outputs=["OUTPUT0"])
                req.input("INPUT0", (2,), np.float32)[:] = i + 1
                reqs.append(req)
            first = asyncio.ensure_future(c.run(reqs[0]))
            second = asyncio.ensure_future(c.run(reqs[1]))
            while lane.header[wl.REQ_DONE] < 1:  # the worker took the first
                await asyncio.sleep(0.01)
            unload = asyncio.ensure_future(c.unload_model("slow2"))
            answers = await asyncio.gather(first, second, return_exceptions=True)
            await unload
            return [a["OUTPUT0"].tolist() if isinstance(a, ShmResult) else a for a in answers]

    first, second = asyncio.run(main())
    assert first == [1.0, 1.0]
    assert isinstance(second, InferpoolError)
    assert second.code in (Code.UNAVAILABLE, Code.NOT_FOUND) and "'slow2'" in second.message


def test_a_reload_revokes_the_lane_and_the_new_version_serves(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=30) as c:
        lane = c.lane("again")
        req = fp32_request(c, "again", np.ones(2, np.float32))
        with c.run(req):
            pass
        c.load_model("again")  # a reload: the new workers serve, the lane is revoked
        assert not lane.usable
        assert "was reloaded" in lane.header.reason()[1]
        with c.run(req) as result:
            assert result["OUTPUT0"].tolist() == [1, 1]


def test_results_held_when_a_lane_ends_stay_valid_until_released(server: Server) -> None:
    """Results a client holds when its lane ends (it closes the lane, the model reloads)
    stay valid: the worker's next outputs of their size do not take their memory.  They are
    the client's leases until it releases them, through the broker; one released before
    the close but never sent on the lane goes back with the close, and nothing is left
    held once the client has released them."""
    with ShmClient(server.endpoint, timeout=30) as c, ShmClient(server.endpoint) as other:

        def leases() -> int:
            return int(c.statistics()["resources"]["leases"])

        before = leases()
        c.lane("plain")
        req = fp32_request(c, "plain", np.full(256, 7, np.float32))
        held = [c.run(req) for _ in range(2)]
        c.run(req).release()  # queued on the lane, never sent on it
        c.close_lane("plain")  # the worker says what the client held: its leases now
        wait_until(lambda: leases() == before + 2, "the two held results leased", 10)
        c.lane("again")
        kept = c.run(fp32_request(c, "again", np.full(256, 5, np.float32)))
        c.load_model("again")  # a reload: the old instance retires, its lane is revoked
        # (its result is leased too, unless the instance exits first: its memory then
        # stays mapped here alone)
        for model in ("plain", "again"):  # outputs of the same size on the broker path
            stomp = fp32_request(other, model, np.full(256, -1, np.float32))
            for _ in range(4):
                with other.run(stomp) as result:
                    assert (result["OUTPUT0"] == -1).all()
        assert all((r["OUTPUT0"] == 7).all() for r in held)
        assert (kept["OUTPUT0"] == 5).all()
        for result in [*held, kept]:
            result.release()
        c.flush()
        other.flush()
        wait_until(lambda: leases() == before, "the held results to go back", 10)


def test_unloading_the_model_revokes_its_lane(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=10) as c:
        lane = c.lane("gone")
        req = fp32_request(c, "gone", np.ones(2, np.float32))
        with c.run(req):
            pass
        c.unload_model("gone")
        assert not lane.usable
        with pytest.raises(InferpoolError) as info:
            c.run(req)  # the broker path now: the model is gone
        assert info.value.code in (Code.NOT_FOUND, Code.UNAVAILABLE)
        assert "gone" in info.value.message
        c.load_model("gone")


def test_a_silent_client_loses_its_lane(server: Server) -> None:
    with ShmClient(server.endpoint, keepalive=False, timeout=10) as c:
        lane = c.lane("plain")
        wait_until(lambda: not lane.usable, "the lane of a silent client revoked", 10)
        assert "silent" in lane.header.reason()[1]
        served(c, "plain")


def test_a_killed_instance_fails_the_request_it_was_running(server: Server) -> None:
    with ShmClient(server.endpoint, timeout=20) as c:
        lane = c.lane("slow")
        req = fp32_request(c, "slow", np.ones(2, np.float32))
        body = lane.body(req)
        assert body is not None
        n = lane.post(body)
        wait_until(lambda: lane.header[wl.REQ_DONE] == n + 1, "the worker took it", 10)
        os.kill(lane.worker_pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(InferpoolError) as info:
            lane.result(n, 20)
        assert time.monotonic() - start < 5
        assert info.value.code is Code.UNAVAILABLE
        assert "slow" in info.value.message
        wait_until(lambda: c.is_model_ready("slow"), "the instance is back", 30)
        with c.run(req) as result:  # a new lane, or the broker path
            assert result["OUTPUT0"].tolist() == [1, 1]
