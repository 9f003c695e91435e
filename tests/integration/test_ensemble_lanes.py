"""Ensembles over lanes, served for real: a ShmClient with lanes runs an ensemble's steps
itself, each on a lane to its model's worker, and the tensors between the steps are written
by one step into the client's own region, where the next step reads them in place.

The repository is test_ensembles.py's (a chain whose last step reports where its input lay,
parallel branches, a pinned version, a batching ensemble around a step that does not
batch, a step that fails or crashes on demand, ensembles lanes cannot serve), with a chain
of variable shape added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import AsyncShmClient, Code, InferpoolError, ShmClient
from inferpool.client.lane_ensemble import EnsembleLane
from inferpool.wire import lane_records as lr
from inferpool.wire import lane_region as wl
from tests.integration.test_ensembles import (
    F4,
    _wait_instance_ready,
    ensemble,
    python_model,
    step,
    tensors,
    write_repository,
)
from tests.support import Server, identity_config, serving, wait_until, write_model


def repository(tmp: Path) -> Path:
    repo = tmp / "repo"
    write_repository(repo)
    for name in ("grow_a", "grow_b"):
        write_model(repo, name, identity_config(name, dims="[ -1 ]"))
    ensemble(
        repo,
        "grow",
        tensors("input", ("IN", "TYPE_FP32", "[ -1 ]"))
        + tensors("output", ("OUT", "TYPE_FP32", "[ -1 ]")),
        step("grow_a", {"INPUT0": "IN"}, {"OUTPUT0": "between"}),
        step("grow_b", {"INPUT0": "between"}, {"OUTPUT0": "OUT"}),
    )
    ensemble(  # one model twice: two lanes to its one instance, one output region
        repo,
        "twice",
        tensors("input", ("IN", "TYPE_FP32", "[ 4 ]")) + tensors("output", ("OUT", *F4)),
        step("mid", {"INPUT0": "IN"}, {"OUTPUT0": "once"}),
        step("mid", {"INPUT0": "once"}, {"OUTPUT0": "OUT"}),
    )
    for name in ("text_a", "text_b"):
        write_model(repo, name, identity_config(name, "TYPE_STRING"))
    ensemble(  # BYTES between the steps: serialized, of any length
        repo,
        "texts",
        tensors("input", ("IN", "TYPE_STRING", "[ -1 ]"))
        + tensors("output", ("OUT", "TYPE_STRING", "[ -1 ]")),
        step("text_a", {"INPUT0": "IN"}, {"OUTPUT0": "between"}),
        step("text_b", {"INPUT0": "between"}, {"OUTPUT0": "OUT"}),
    )
    python_model(
        repo, "silent", SILENT, tensors("input", ("X", *F4)) + tensors("output", ("Y", *F4))
    )
    ensemble(  # its first step answers without the output the second one reads
        repo,
        "hollow",
        tensors("input", ("IN", *F4)) + tensors("output", ("OUT", *F4)),
        step("silent", {"X": "IN"}, {"Y": "nothing"}),
        step("mid", {"INPUT0": "nothing"}, {"OUTPUT0": "OUT"}),
    )
    return repo


SILENT = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(repository, "--exit-on-error=false")  # with ensembles lanes refuse


def lanes_of(c: ShmClient, model: str) -> EnsembleLane:
    lanes = c.lane(model)
    assert isinstance(lanes, EnsembleLane)
    return lanes


def run(c: ShmClient, model: str, name: str, x: np.ndarray) -> dict[str, np.ndarray]:
    """One request of ``model`` with input ``name`` = ``x``: its outputs, copied."""
    req = c.request(model)
    try:
        req.input(name, x.shape, x.dtype)[...] = x
        with c.run(req) as result:
            return {k: np.array(v) for k, v in result.outputs.items()}
    finally:
        req.close()


def lane_requests(c: ShmClient, model: str) -> int:
    stats = c.statistics(model)["model_stats"][0]
    return int(stats["lane_stats"]["success"])


def test_the_steps_run_over_lanes_and_read_each_other_in_the_clients_region(
    server: Server,
) -> None:
    x = np.array([1, 2, 3, 4], np.float32)
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        before = {m: lane_requests(c, m) for m in ("chain", "pre", "mid", "post")}
        stats_before = c.statistics("chain")["model_stats"][0]["inference_stats"]
        req = c.request("chain", ["OUT", "SOURCE"])
        req.input("IN", (4,), np.float32)[:] = x
        for _ in range(4):
            with c.run(req) as result:
                np.testing.assert_array_equal(result["OUT"], x * 2 + 1)
                # the last step read its input in this client's own region
                assert result["SOURCE"][0].decode() == c.session.region.name
        lanes = lanes_of(c, "chain")
        assert [s.lane.model for s in lanes.steps] == ["pre", "mid", "post"]
        # the first request's two intermediate tensors were copied into windows once;
        # from then on each step wrote its output there itself
        assert lanes.copies == 2 and [set(w.spans) for w in lanes.spare] == [{"doubled", "same"}]
        # from the second request on, 'mid' and 'post' were posted with 'pre', each to run
        # once the step before had answered (its worker waits for that answer on its lane)
        assert (lanes.ahead, lanes.redone) == (6, 0)

        def counted() -> bool:  # the workers send what lanes served every 50 ms at most
            return all(lane_requests(c, m) - before[m] == 4 for m in before)

        wait_until(counted, "the ensemble and each step's model to count the 4 requests", 10)
        # the ensemble counts its requests once, and the sum of its steps' times
        after = c.statistics("chain")["model_stats"][0]["inference_stats"]
        for part in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
            assert after[part]["count"] - stats_before[part]["count"] == 4, part
        assert after["compute_infer"]["ns"] > stats_before["compute_infer"]["ns"]
        steps_infer = sum(
            c.statistics(m)["model_stats"][0]["inference_stats"]["compute_infer"]["ns"]
            for m in ("pre", "mid", "post")
        )
        assert after["compute_infer"]["ns"] <= steps_infer
        with ShmClient(server.endpoint, input_bytes=1 << 20) as broker_path:
            direct = run(broker_path, "chain", "IN", x)
        np.testing.assert_array_equal(direct["OUT"], x * 2 + 1)
        c.close_lane("chain")  # closing the ensemble's lanes closes every one of them
        wait_until(lambda: c.statistics()["resources"]["lanes"] == 0, "the lanes to end", 10)
        with c.run(req) as result:  # the broker path now: the arena of a worker
            assert result["SOURCE"][0].decode().startswith(f"inferpool-{server.run_id}-out")


def test_windows_grow_with_the_tensors(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        # (size, copies so far, steps posted again so far): a step posted to read a tensor
        # where it lay last time runs again when it lies elsewhere (a new shape, or a new,
        # larger window), and never on what it was promised
        for size, copies, redone in [
            (4, 1, 0),
            (4, 1, 0),
            (1000, 2, 1),
            (1000, 2, 1),
            (4, 2, 2),
            (3000, 3, 3),
        ]:
            x = np.arange(size, dtype=np.float32)
            np.testing.assert_array_equal(run(c, "grow", "IN", x)["OUT"], x)
            lanes = lanes_of(c, "grow")
            assert (lanes.copies, lanes.redone) == (copies, redone), size


def test_tensors_that_do_not_fit_the_clients_region_take_the_broker_path(server: Server) -> None:
    """The client's input region holds the request's input but not the tensor between the
    steps: the request is answered on the broker path, as are the next second's."""
    n = 60_000
    x = np.arange(n, dtype=np.float32)
    with ShmClient(server.endpoint, input_bytes=4 * n + 4096, lane=True, timeout=20) as c:
        for _ in range(3):
            np.testing.assert_array_equal(run(c, "grow", "IN", x)["OUT"], x)
        lanes = lanes_of(c, "grow")
        assert lanes.usable and lanes.crowded_until > 0 and lanes.copies == 0
        assert lanes.body(c.request("grow", ["OUT"])) is None  # the broker path, for now


def test_each_lease_goes_back_on_the_lane_that_granted_it(server: Server) -> None:
    """Both steps run on the one instance of 'mid' (two lanes, one output region): the
    answer's lease goes back on the last step's lane, which takes it (a lease given back
    on the other lane would be refused, NOT_FOUND, with the next request)."""
    x = np.arange(4, dtype=np.float32)
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        req = c.request("twice", ["OUT"])
        req.input("IN", (4,), np.float32)[:] = x
        held = [c.run(req) for _ in range(3)]  # three answers alive at once
        assert [r["OUT"].tolist() for r in held] == [x.tolist()] * 3
        for result in held:
            result.release()
        lanes = lanes_of(c, "twice")
        assert [len(la.releases) for la in lanes.lanes] == [0, 3]
        with c.run(req) as result:  # carries the three releases: none is refused
            assert result["OUT"].tolist() == x.tolist()
        assert c.flush() == 1  # the answer's lease, on the last step's lane: not refused


def test_bytes_between_the_steps(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        for texts, copies in [
            (["a", "bc"], 1),
            (["a longer text than before " * 8, "", "é"], 2),  # outgrows its window
            (["x"], 2),  # fits the window now
        ]:
            req = c.request("texts", ["OUT"])
            req.set_input("IN", np.array(texts, dtype=np.object_))
            with c.run(req) as result:
                assert [t.decode() for t in result["OUT"]] == texts
            req.close()
            assert lanes_of(c, "texts").copies == copies


def test_a_step_past_the_timeout_fails_by_name_and_the_lanes_go_on(server: Server) -> None:
    x = np.arange(4, dtype=np.float32)
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        req = c.request("fork")
        req.input("IN", (4,), np.float32)[:] = x
        with pytest.raises(InferpoolError) as err:
            c.run(req, timeout=0.1)  # each branch sleeps 0.4 s
        assert err.value.code is Code.TIMEOUT
        assert err.value.message.startswith("in ensemble 'fork', step 0 (model 'slow') failed: ")
        with c.run(req) as result:  # the late answers are dropped on the way
            np.testing.assert_array_equal(result["OUT"], 2 * x)
        assert lanes_of(c, "fork").usable


def test_branches_on_a_model_of_two_instances_still_overlap(server: Server) -> None:
    x = np.arange(4, dtype=np.float32)
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        out = run(c, "fork", "IN", x)
        lanes = lanes_of(c, "fork")
        assert {lanes.steps[0].lane.instance, lanes.steps[1].lane.instance} == {
            "slow_0_0",
            "slow_0_1",
        }
    np.testing.assert_array_equal(out["OUT"], 2 * x)
    (a0, a1), (b0, b1) = out["SPAN_A"], out["SPAN_B"]
    assert a0 < b1 and b0 < a1, "the two branches did not overlap"


def test_versions_and_the_batch_dimension_as_the_broker_does(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        assert run(c, "pinned", "IN", np.zeros(4, np.float32))["OUT"].tolist() == [10] * 4
        assert lanes_of(c, "pinned").steps[0].lane.version == "1"
        out = run(c, "mixed", "IN", np.arange(4, dtype=np.float32).reshape(1, 4))["OUT"]
        assert out.shape == (1, 4) and out.tolist() == [[0, 1, 2, 3]]
        with pytest.raises(InferpoolError) as err:  # as in Triton: only a batch of one
            run(c, "mixed", "IN", np.zeros((2, 4), np.float32))
        assert "in ensemble 'mixed', step 0 (model 'mid') failed: unexpected shape for input " in (
            err.value.message
        )
        with pytest.raises(InferpoolError, match="unexpected shape for input 'IN'"):
            run(c, "chain", "IN", np.zeros(5, np.float32))  # the ensemble's own check
        assert run(c, "mixed", "IN", np.ones((1, 4), np.float32))["OUT"].tolist() == [[1] * 4]


def test_a_failing_step_is_named_and_a_crashed_one_comes_back(server: Server) -> None:
    ok = np.ones(4, np.float32)
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c:
        with pytest.raises(InferpoolError) as err:
            run(c, "chain", "IN", np.array([-1, 0, 0, 0], np.float32))
        assert err.value.code is Code.INTERNAL
        assert "in ensemble 'chain', step 0 (model 'pre') failed: pre refuses -1" in (
            err.value.message
        )
        wait_until(
            lambda: c.statistics("chain")["model_stats"][0]["lane_stats"]["fail"] >= 1,
            "the ensemble to count its failed request",
            10,
        )
        assert run(c, "chain", "IN", ok)["OUT"].tolist() == [3] * 4
        lanes = lanes_of(c, "chain")
        assert lanes.usable
        with pytest.raises(InferpoolError) as err:
            run(c, "chain", "IN", np.array([-2, 0, 0, 0], np.float32))
        assert err.value.code is Code.UNAVAILABLE
        assert "in ensemble 'chain', step 0 (model 'pre') failed: lane " in err.value.message
        assert "died with exit code 3" in err.value.message
        # the broker ended the ensemble's other lanes with it
        wait_until(lambda: not any(la.usable for la in lanes.lanes), "every lane to end", 10)
        _wait_instance_ready(c, "pre")
        assert run(c, "chain", "IN", ok)["OUT"].tolist() == [3] * 4  # the broker path
        wait_until(
            lambda: (
                run(c, "chain", "IN", ok)["OUT"].tolist() == [3] * 4
                and lanes_of(c, "chain") is not lanes
            ),
            "new lanes for the ensemble",
            10,
        )
    with ShmClient(server.endpoint, input_bytes=1 << 20) as other:  # the lanes go with it
        wait_until(lambda: other.statistics()["resources"]["lanes"] == 0, "no lane left", 10)


def test_an_answer_held_when_the_lanes_end_stays_the_clients_until_released(
    server: Server,
) -> None:
    """The ensemble's lanes end (the client closes them) while the client holds an answer,
    whose output lies in the last step's worker's region: it stays valid while that worker
    serves other requests, as the client's lease, until the client releases it."""
    x = np.array([1, 2, 3, 4], np.float32)
    with (
        ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as c,
        ShmClient(server.endpoint, input_bytes=1 << 20) as other,
    ):

        def leases() -> int:
            return int(c.statistics()["resources"]["leases"])

        before = leases()
        req = c.request("chain", ["OUT"])
        req.input("IN", (4,), np.float32)[:] = x
        with c.run(req):
            pass
        held = c.run(req)  # leased from the last step (its step answers two outputs)
        assert list(held.outputs) == ["OUT"]  # only what it asked for, as on the broker path
        c.close_lane("chain")
        assert len(held.leases) == 2
        wait_until(lambda: leases() == before + 2, "the held answer leased", 10)
        for _ in range(4):  # the broker path: the last step's outputs of the same size
            assert run(other, "chain", "IN", x + 10)["OUT"].tolist() == (x * 2 + 21).tolist()
        np.testing.assert_array_equal(held["OUT"], x * 2 + 1)
        held.release()
        c.flush()
        other.flush()
        wait_until(lambda: leases() == before, "the held answer to go back", 10)


def test_a_step_that_leaves_out_an_output_ends_the_request_as_on_the_broker_path(
    server: Server,
) -> None:
    x = np.zeros(4, np.float32)
    errors = []
    for lane in (True, False):
        with ShmClient(server.endpoint, input_bytes=1 << 20, lane=lane, timeout=20) as c:
            with pytest.raises(InferpoolError) as err:
                run(c, "hollow", "IN", x)
            errors.append((err.value.code, err.value.message))
    assert (
        errors[0]
        == errors[1]
        == (
            Code.INVALID_ARG,
            "in ensemble 'hollow', unexpected deadlock, at least one output is not set while no "
            "more ensemble steps can be made",
        )
    )


def test_a_step_that_waits_runs_only_on_its_own_ensembles_answer_where_it_was_written(
    server: Server,
) -> None:
    """Requests posted to wait for another step's answer (FLAG_AFTER), made by hand: the
    worker refuses to wait outside an ensemble, checks the answer is the request's, that it
    succeeded and that it wrote the input where the request reads it, and a client that
    gives up on a wait gets it cancelled."""
    fp32 = wl.DATATYPES["FP32"]
    with ShmClient(server.endpoint, input_bytes=1 << 20, timeout=10) as c:
        own = np.frombuffer(c.session.region.buf, np.float32, 4, 0)
        own[:] = 1
        body = (lr.pack_request_body([wl.Tensor(0, fp32, 0, 16, (4,))], [0]), 1, 1)
        plain = c.lane("mid")
        with pytest.raises(InferpoolError, match="only for the lanes of an ensemble"):
            plain.result(plain.post(body, 0, lr.After(0, 0, 1)), 10)
        lanes = lanes_of(c, "chain")
        pre, mid = lanes.steps[0].lane, lanes.steps[1].lane
        with pytest.raises(InferpoolError, match="no step 7 in this lane's ensemble"):
            mid.result(mid.post(body, 0, lr.After(7, 0, 1)), 10)

        def after_pre(request_id: int, mine: int = 0) -> tuple[int, int]:
            """mid posted to wait for pre's next answer, then pre posted: their numbers."""
            waiting = mid.post(body, 0, lr.After(0, pre.sent, 1), mine or request_id)
            return pre.post(body, 0, None, request_id), waiting

        made, waiting = after_pre(77)  # pre writes into its worker's region: not placed
        pre.result(made, 10).release()
        with pytest.raises(InferpoolError, match="input 0 of request 77 is not where step 0"):
            mid.result(waiting, 10)
        made, waiting = after_pre(78, mine=76)
        pre.result(made, 10).release()
        with pytest.raises(InferpoolError, match="is request 78's, not request 76's"):
            mid.result(waiting, 10)
        own[0] = -1  # pre refuses it: the step after it does not run
        made, waiting = after_pre(79)
        with pytest.raises(InferpoolError, match="pre refuses -1"):
            pre.result(made, 10)
        with pytest.raises(InferpoolError) as err:
            mid.result(waiting, 10)
        assert err.value.code is Code.CANCELLED and "did not run: step 0" in err.value.message
        never = mid.post(body, 0, lr.After(0, pre.sent + 5, 1), 80)  # pre never answers it
        with pytest.raises(InferpoolError) as err:
            mid.result(never, 0.3)
        assert err.value.code is Code.TIMEOUT
        own[0] = 1
        assert run(c, "chain", "IN", np.ones(4, np.float32))["OUT"].tolist() == [3] * 4
        assert lanes.usable


BAD_REQUESTS = [  # (model, inputs, outputs asked): each refused before any step runs
    ("chain", [("IN", (4,), np.int32)], ["OUT"]),  # the datatype
    ("chain", [("IN", (5,), np.float32)], ["OUT"]),  # the shape
    ("chain", [("IN", (4,), np.float32), ("NOPE", (4,), np.float32)], ["OUT"]),
    ("chain", [], ["OUT"]),  # a required input left out
    ("chain", [("IN", (4,), np.float32)], ["NOPE"]),
    ("chain", [("IN", (4,), np.int32)], ["NOPE"]),  # the inputs are checked first
    ("mixed", [("IN", (4,), np.float32)], ["OUT"]),  # no batch dimension
    ("mixed", [("IN", (9, 4), np.float32)], ["OUT"]),  # more than max_batch_size
]


@pytest.mark.parametrize("bad", BAD_REQUESTS, ids=range(len(BAD_REQUESTS)))
def test_a_bad_request_is_refused_over_lanes_in_the_broker_paths_words(
    server: Server, bad: tuple[str, list[tuple[str, tuple[int, ...], type]], list[str]]
) -> None:
    """The client checks a request it would run over an ensemble's lanes as the broker checks
    it (wire.contract.InputChecks): the same code and message."""
    model, inputs, outputs = bad
    errors = []
    for lane in (True, False):
        with ShmClient(server.endpoint, input_bytes=1 << 20, timeout=20) as c:
            req = c.request(model, outputs)
            for name, shape, dtype in inputs:
                req.input(name, shape, dtype)[...] = 0
            with pytest.raises(InferpoolError) as err:
                if lane:
                    lanes_of(c, model).body(req)  # the client's own check, before any step
                else:
                    c.run(req)  # the broker's
            req.close()
            errors.append((err.value.code, err.value.message))
    assert errors[0] == errors[1]
    assert errors[0][0] is Code.INVALID_ARG


def test_ensembles_lanes_cannot_serve_are_refused_by_name(server: Server) -> None:
    with ShmClient(server.endpoint, input_bytes=1 << 20, timeout=20) as c:
        with pytest.raises(InferpoolError) as err:
            c.lane("batched")
        assert err.value.code is Code.UNSUPPORTED
        assert "in ensemble 'batched' version 1, step 0 (model 'mid_b'): " in err.value.message
        assert "uses dynamic batching" in err.value.message
        with pytest.raises(InferpoolError, match=r"step 0 \(model 'repeat'\).*is decoupled"):
            c.lane("squares")
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        np.testing.assert_array_equal(run(c, "batched", "IN", x)["OUT"], x)  # the broker path
    with ShmClient(server.endpoint, input_bytes=1 << 20, lane=True, timeout=20) as auto:
        np.testing.assert_array_equal(run(auto, "batched", "IN", x)["OUT"], x)  # so here too
        assert ("batched", "") in auto.session.lanes.unserved


def test_an_asyncio_client_runs_many_requests_at_once_each_in_its_own_windows(
    server: Server,
) -> None:
    """Twelve chain requests at once over the same lanes, each with its own input: every
    answer is its own (no run reads another's tensors), a failing one is named, and the
    lanes end with the client."""

    async def main() -> None:
        async with AsyncShmClient(server.endpoint, input_bytes=1 << 20, lane=True) as c:
            requests = []
            for i in range(12):
                req = c.request("chain", ["OUT", "SOURCE"])
                req.input("IN", (4,), np.float32)[:] = np.arange(4) + 10 * i
                requests.append(req)
            for _ in range(3):
                results = await asyncio.gather(*(c.run(r) for r in requests))
                for i, result in enumerate(results):
                    want = (np.arange(4) + 10 * i) * 2 + 1
                    np.testing.assert_array_equal(result["OUT"], want)
                    assert result["SOURCE"][0].decode() == c.session.region.name
                    result.release()
            lanes = await c.lane("chain")
            assert isinstance(lanes, EnsembleLane) and 1 < len(lanes.spare) <= 12
            bad = c.request("chain", ["OUT"])
            bad.input("IN", (4,), np.float32)[:] = [-1, 0, 0, 0]
            with pytest.raises(InferpoolError, match=r"step 0 \(model 'pre'\) failed: pre refuses"):
                await c.run(bad)
            await c.flush()

    asyncio.run(main())
    with ShmClient(server.endpoint, input_bytes=1 << 20) as other:
        wait_until(lambda: other.statistics()["resources"]["lanes"] == 0, "no lane left", 10)
