"""Cancellation, served for real: the ``cancel`` message, AsyncClient calls given up on,
streams left early, clients that disconnect and KServe callers that go away (HTTP, gRPC),
watched from a python model that records what it saw (tests.integration.recording)."""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from inferpool.client import AsyncClient, AsyncShmClient, Client, Code, InferpoolError, ShmClient
from inferpool.client.lane import Lane
from tests.integration.recording import Served, model_py, served, tags, wait_seen
from tests.support import write_model

# waits (up to 20 s) until its request is cancelled; X = 0 answers at once
WAITER = model_py("""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.record = Recorder(args)

    def execute(self, requests):
        responses = []
        for request in requests:
            t = tag(request)
            self.record(start=t)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            deadline = time.monotonic() + (20 if x[0] else 0)
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(0.005)
            self.record(end=t, cancelled=request.is_cancelled())
            if request.is_cancelled():
                error = pb_utils.TritonError("stopped", pb_utils.TritonError.CANCELLED)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
""")

# a stream that goes on until it is cancelled (at most 2000 responses)
TICKER = model_py("""
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.record = Recorder(args)
        self.threads = []

    def execute(self, requests):
        for request in requests:
            thread = threading.Thread(target=self.tick, args=(request,))
            thread.start()
            self.threads.append(thread)
        return None

    def tick(self, request):
        sender = request.get_response_sender()
        sent = 0
        while sent < 2000 and not sender.is_cancelled():
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([sent], np.int32))]))
            sent += 1
            time.sleep(0.01)
        self.record(end=tag(request), cancelled=sender.is_cancelled(), sent=sent)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
""")


# answers after 0.3 s whatever happens: a late answer that is not an error
SLEEPER = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.3)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy())])
            for r in requests
        ]
"""


# calls the ticker (a decoupled BLS call), cancels the call after three responses and reads
# on to its end: answers how many responses carried a tensor, and whether one was an error
BLS_CANCELLER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            tag = json.loads(request.parameters())["tag"]
            call = pb_utils.InferenceRequest(
                model_name="ticker", inputs=[], requested_output_names=["N"], request_id=tag
            )
            responses = call.exec(decoupled=True)
            ticks = errors = 0
            for response in responses:
                if response.has_error():
                    errors += 1
                elif response.output_tensors():
                    ticks += 1
                    if ticks == 3:
                        responses.cancel()
                        responses.cancel()  # again: nothing more
            y = np.array([ticks, errors], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""


# a stream of three responses sent from execute itself: the instance is busy meanwhile
BLOCKER = model_py("""
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.record = Recorder(args)

    def execute(self, requests):
        for request in requests:
            self.record(start=tag(request))
            sender = request.get_response_sender()
            for n in range(3):
                time.sleep(0.05)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("N", np.array([n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
""")

# two calls to the blocker, the second cancelled at once (queued behind the first): answers
# the first's responses with a tensor and the second's CANCELLED errors
BLS_TWO = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def call(tag):
    request = pb_utils.InferenceRequest(
        model_name="blocker", inputs=[], requested_output_names=["N"], request_id=tag
    )
    return request.exec(decoupled=True)


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            tag = json.loads(request.parameters())["tag"]
            first, second = call(tag + "-first"), call(tag + "-second")
            second.cancel()
            cancelled = sum(
                r.has_error() and r.error().code() == pb_utils.TritonError.CANCELLED
                for r in second
            )
            ticks = sum(bool(r.output_tensors()) for r in first)
            y = np.array([ticks, cancelled], np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return out
"""


def write_repository(repo: Path) -> None:
    io = """
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    config = f'name: "waiter"\nbackend: "python"\n{io}'
    write_model(repo, "waiter", config, files={"1/model.py": WAITER})
    decoupled = """
        model_transaction_policy { decoupled: true }
        output [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    config = f'name: "ticker"\nbackend: "python"\n{decoupled}'
    write_model(repo, "ticker", config, files={"1/model.py": TICKER})
    steps = """
        ensemble_scheduling { step [
          { model_name: "waiter" model_version: -1
            input_map { key: "X" value: "X" } output_map { key: "Y" value: "MID" } },
          { model_name: "waiter" model_version: -1
            input_map { key: "X" value: "MID" } output_map { key: "Y" value: "Y" } }
        ] }
    """
    write_model(repo, "waiters", f'name: "waiters"\nplatform: "ensemble"\n{io}\n{steps}')
    config = f'name: "lane_waiter"\nbackend: "python"\n{io}'  # the lanes' own: its records
    write_model(repo, "lane_waiter", config, files={"1/model.py": WAITER})
    config = f'name: "sleeper"\nbackend: "python"\n{io}'
    write_model(repo, "sleeper", config, files={"1/model.py": SLEEPER})
    both = """
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]
    """
    config = f'name: "bls_canceller"\nbackend: "python"\n{both}'
    write_model(repo, "bls_canceller", config, files={"1/model.py": BLS_CANCELLER})
    write_model(
        repo,
        "bls_two",
        f'name: "bls_two"\nbackend: "python"\n{both}',
        files={"1/model.py": BLS_TWO},
    )
    config = f'name: "blocker"\nbackend: "python"\n{decoupled}'
    write_model(repo, "blocker", config, files={"1/model.py": BLOCKER})


@pytest.fixture(scope="module")
def live() -> Iterator[Served]:
    with served("ipc-", write_repository, kserve=True) as got:
        yield got


def new_tag() -> str:
    return uuid.uuid4().hex[:12]


def send_waiter(client: Client, tag: str, x: int = 1, model: str = "waiter") -> str:
    """An infer request for the waiter (or an ensemble of it), not waited for: its id."""
    return client._send(
        {
            "type": "infer",
            "model_name": model,
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [1]}],
            "parameters": {"tag": tag},
        },
        [np.array([x], np.int32).data],
    )


def error_of(client: Client, request_id: str) -> dict[str, Any]:
    header, _ = client._recv(request_id, 10)
    assert "error" in header, header
    return dict(header["error"])


def failures(client: Client) -> int:
    return int(client.statistics("waiter")["model_stats"][0]["inference_stats"]["fail"]["count"])


def test_cancel_a_queued_and_an_executing_request(live: Served) -> None:
    waiter = live.repo / "waiter"
    running, queued = new_tag(), new_tag()
    with live.server.client() as c:
        failed = failures(c)
        first = send_waiter(c, running)
        wait_seen(waiter, {"start": running})
        second = send_waiter(c, queued, x=0)  # waits behind the first: one instance
        assert c.call("cancel", request_id=second)["cancelled"] == 1
        err = error_of(c, second)
        assert err["code"] == "CANCELLED" and "was cancelled" in err["message"]
        assert c.call("cancel", request_id=first)["cancelled"] == 1
        assert error_of(c, first)["code"] == "CANCELLED"  # at once, not when the model stops
        wait_seen(waiter, {"end": running, "cancelled": True})  # the backend saw it
        assert c.call("cancel", request_id=first)["cancelled"] == 0  # nothing left to cancel
        assert c.infer("waiter", {"X": np.array([0], np.int32)})["Y"].tolist() == [0]
        assert queued not in tags(waiter, "start")  # dropped from the queue, never run
        assert failures(c) == failed + 2


def test_cancelling_an_ensemble_cancels_its_steps(live: Served) -> None:
    """Its executing step is flagged for the backend, its queued one leaves the queue, and
    no later step starts: the steps of a request nobody waits for stop running."""
    waiter = live.repo / "waiter"
    running, queued = new_tag(), new_tag()
    with live.server.client() as c:
        first = send_waiter(c, running, model="waiters")
        wait_seen(waiter, {"start": running})
        second = send_waiter(c, queued, model="waiters")  # its first step waits: one instance
        assert c.call("cancel", request_id=second)["cancelled"] == 1
        err = error_of(c, second)
        assert (
            err["code"] == "CANCELLED" and "for model 'waiters' was cancelled" in (err["message"])
        )
        assert c.call("cancel", request_id=first)["cancelled"] == 1
        assert error_of(c, first)["code"] == "CANCELLED"
        wait_seen(waiter, {"end": running, "cancelled": True})  # the step's backend saw it
        out = c.infer("waiters", {"X": np.array([0], np.int32)}, parameters={"tag": new_tag()})
        assert out["Y"].tolist() == [0]
        assert tags(waiter, "start").count(running) == 1  # its second step never started
        assert queued not in tags(waiter, "start")


def test_cancel_needs_a_request_id(live: Served) -> None:
    with live.server.client() as c:
        for bad in (None, True, [1]):
            with pytest.raises(InferpoolError, match="cancel needs 'request_id'") as err:
                c.call("cancel", request_id=bad)
            assert err.value.code is Code.INVALID_ARG


def test_async_client_cancels_a_cancelled_task_and_a_timeout(live: Served) -> None:
    waiter = live.repo / "waiter"
    by_task, by_timeout = new_tag(), new_tag()

    async def main() -> None:
        async with AsyncClient(live.server.endpoint) as c:
            x = {"X": np.array([1], np.int32)}
            task = asyncio.create_task(c.infer("waiter", x, parameters={"tag": by_task}))
            while by_task not in tags(waiter, "start"):
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(InferpoolError) as err:
                await c.infer("waiter", x, parameters={"tag": by_timeout}, timeout=0.5)
            assert err.value.code is Code.TIMEOUT
            out = await c.infer("waiter", {"X": np.array([0], np.int32)})
            assert out["Y"].tolist() == [0]  # the client goes on; late answers are dropped

    asyncio.run(main())
    wait_seen(waiter, {"end": by_task, "cancelled": True})
    wait_seen(waiter, {"end": by_timeout, "cancelled": True})


def response_stats(client: Client, model: str) -> dict[int, dict[str, Any]]:
    stats = client.statistics(model)["model_stats"][0]["response_stats"]
    return {int(index): counts for index, counts in stats.items()}


def test_a_stream_left_early_is_cancelled(live: Served) -> None:
    ticker = live.repo / "ticker"
    tag = new_tag()
    with live.server.client() as c:
        before = response_stats(c, "ticker")
        got = []
        for result in c.stream("ticker", {}, parameters={"tag": tag}):
            got.append(int(result.outputs["N"][0]))
            if len(got) == 3:
                break  # the generator closes: the client sends the cancel
        assert got == [0, 1, 2]
        event = wait_seen(ticker, {"end": tag, "cancelled": True})
        assert event["sent"] < 2000
        after = response_stats(c, "ticker")
    cancels = {
        i: n["cancel"]["count"] - before.get(i, {}).get("cancel", {}).get("count", 0)
        for i, n in after.items()
    }
    [index] = [i for i, n in cancels.items() if n]  # one response counted as cancelled
    assert cancels[index] == 1 and index >= 3  # after the three the client read
    assert all(after[i]["success"]["count"] >= 1 for i in range(index))


def test_a_disconnected_client_s_requests_are_cancelled(live: Served) -> None:
    waiter = live.repo / "waiter"
    running, queued = new_tag(), new_tag()
    gone = live.server.client()
    send_waiter(gone, running)
    wait_seen(waiter, {"start": running})
    send_waiter(gone, queued, x=0)
    gone.close()  # its connection closes: the broker's socket monitor says so
    wait_seen(waiter, {"end": running, "cancelled": True})
    with live.server.client() as c:
        assert c.infer("waiter", {"X": np.array([0], np.int32)})["Y"].tolist() == [0]
    assert queued not in tags(waiter, "start")


def test_kserve_callers_that_go_away_are_cancelled(live: Served) -> None:
    """An HTTP connection closed mid-inference, a gRPC call cancelled, a gRPC stream stopped
    with its requests unanswered: each is cancelled at the broker."""
    waiter, ticker = live.repo / "waiter", live.repo / "ticker"
    by_http, by_grpc, by_stream = new_tag(), new_tag(), new_tag()
    body = json.dumps(
        {
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [1]}],
            "parameters": {"tag": by_http},
        }
    ).encode()
    with socket.create_connection(("127.0.0.1", live.server.http_port)) as conn:
        conn.sendall(
            b"POST /v2/models/waiter/infer HTTP/1.1\r\nHost: test\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_seen(waiter, {"start": by_http})
    wait_seen(waiter, {"end": by_http, "cancelled": True})  # the connection closed

    client = grpcclient.InferenceServerClient(live.server.grpc_url)
    try:
        x = grpcclient.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        call = client.async_infer(
            "waiter", [x], lambda result, error: None, parameters={"tag": by_grpc}
        )
        wait_seen(waiter, {"start": by_grpc})
        call.cancel()
        wait_seen(waiter, {"end": by_grpc, "cancelled": True})

        streamed: queue.Queue[Any] = queue.Queue()
        client.start_stream(lambda result, error: streamed.put((result, error)))
        client.async_stream_infer("ticker", [], parameters={"tag": by_stream})
        result, error = streamed.get(timeout=20)  # the first response: the stream runs
        assert error is None and result.as_numpy("N").tolist() == [0]
        client.stop_stream(cancel_requests=True)  # its request unanswered
        assert wait_seen(ticker, {"end": by_stream, "cancelled": True})["sent"] < 2000
    finally:
        client.close()
    with live.server.client() as c:  # the server goes on serving
        assert c.infer("waiter", {"X": np.array([0], np.int32)})["Y"].tolist() == [0]


def lane_waiter(live: Served) -> Path:
    return live.repo / "lane_waiter"


def test_a_lane_request_given_up_on_is_cancelled(live: Served) -> None:
    """A lane request whose timeout passes is cancelled in its slot: its backend sees
    is_cancelled() and stops; the lane goes on (the late answer is dropped)."""
    model = lane_waiter(live)
    with ShmClient(live.server.endpoint, lane=True, timeout=10) as c:
        c.lane("lane_waiter")
        request = c.request("lane_waiter", ["Y"])
        x = request.input("X", (1,), np.int32)
        x[:] = 1
        with pytest.raises(InferpoolError) as err:
            c.run(request, timeout=0.5)
        assert err.value.code is Code.TIMEOUT
        assert "on lane" in err.value.message  # it went on the lane, not the broker path
        stopped = wait_seen(model, {"cancelled": True})
        x[:] = 0
        with c.run(request) as result:
            assert result["Y"].tolist() == [0]
    assert stopped["end"] in tags(model, "start")


def test_an_async_lane_request_cancelled_while_queued_never_runs(live: Served) -> None:
    """Two lane requests in flight, both cancelled: the one executing sees is_cancelled();
    the one behind it is answered CANCELLED without running."""
    model = lane_waiter(live)

    async def main() -> None:
        async with AsyncShmClient(live.server.endpoint, lane=True, timeout=10) as c:
            await c.lane("lane_waiter")
            first, second = (c.request("lane_waiter", ["Y"]) for _ in range(2))
            for request in (first, second):
                request.input("X", (1,), np.int32)[:] = 1
            starts = len(tags(model, "start"))
            running = asyncio.create_task(c.run(first))
            while len(tags(model, "start")) == starts:
                await asyncio.sleep(0.02)
            queued = asyncio.create_task(c.run(second))
            await asyncio.sleep(0)  # posted behind the first
            for task in (queued, running):
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            again = c.request("lane_waiter", ["Y"])
            again.input("X", (1,), np.int32)[:] = 0
            result = await c.run(again)
            assert result["Y"].tolist() == [0]
            result.release()
            assert len(tags(model, "start")) == starts + 2  # the first, and this one

    asyncio.run(main())


def test_cancelling_on_a_lane_already_closed_does_nothing(live: Served) -> None:
    """An asyncio task cancelled after its client closed: nothing is left to mark."""
    with ShmClient(live.server.endpoint, lane=True, timeout=10) as c:
        lane = c.lane("lane_waiter")
    assert isinstance(lane, Lane) and lane.closed
    assert lane.cancel(0) is False


def test_an_async_lane_answer_that_comes_too_late_gives_its_outputs_back(live: Served) -> None:
    """A lane request whose timeout passed is answered after all: nobody gets the answer,
    and its output's lease goes back with the lane's next request."""

    async def main() -> None:
        async with AsyncShmClient(live.server.endpoint, lane=True, timeout=10) as c:
            lane = await c.lane("sleeper")
            request = c.request("sleeper", ["Y"])
            request.input("X", (1,), np.int32)[:] = 1
            with pytest.raises(InferpoolError) as err:
                await c.run(request, timeout=0.05)
            assert err.value.code is Code.TIMEOUT
            for _ in range(500):  # until the late answer is in and settled
                if lane.releases:
                    break
                await asyncio.sleep(0.02)
            assert len(lane.releases) == 1  # its token, for the worker to free
            assert c.session.held[lane.output_region] == 0

    asyncio.run(main())


def test_a_model_cancels_its_decoupled_bls_call(live: Served) -> None:
    """Triton's cancel() on a decoupled call's response iterator: the called stream sees
    is_cancelled() and ends; the caller reads the responses up to that end."""
    tag = new_tag()
    with live.server.client() as c:
        x = {"X": np.array([1], np.int32)}
        ticks, errors = c.infer("bls_canceller", x, parameters={"tag": tag})["Y"].tolist()
    got = wait_seen(live.repo / "ticker", {"end": tag, "cancelled": True})
    assert 3 <= ticks == got["sent"] < 2000 and errors == 0


def test_a_decoupled_bls_call_cancelled_while_queued_never_runs(live: Served) -> None:
    """A call cancelled while it waits behind another on the called model's one instance
    leaves the queue: its iterator gives one CANCELLED error, and it never runs."""
    tag = new_tag()
    with live.server.client() as c:
        x = {"X": np.array([1], np.int32)}
        assert c.infer("bls_two", x, parameters={"tag": tag})["Y"].tolist() == [3, 1]
    assert tags(live.repo / "blocker", "start") == [f"{tag}-first"]
