"""Every region a client can shrink, on every path that reads or writes it: a client's own
registered object (an input, an output window), its server-made input region (the broker
path and a lane), and its lane's region (then closed, left, or left asleep).

Shrunk before the request, each is refused by name (INVALID_ARG) and the worker lives on.
Shrunk while a model reads it (a race, run many times: the shrink comes at a random moment
of a read that takes a few milliseconds), the request is refused by name, or the worker dies
of SIGBUS and the broker blames the client's object: the server runs with --max-restarts 0,
so a death counted against the model would make it FAILED, and it never is.

Short by default; ``INFERPOOL_LONG_TESTS=1`` runs each race 200 times.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from inferpool.shm.region import Region
from tests.raw_client import shrink, shrink_a_lane_then, workers
from tests.reliability.support import LONG, record
from tests.support import Server, identity_config, wait_until, write_model

RACES = 200 if LONG else 6
READER = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            total = 0.0
            for part in np.array_split(x, 8):  # a read that takes a few milliseconds
                total += float(part.sum())
                time.sleep(0.0005)
            out = pb_utils.Tensor("OUTPUT0", np.array([total], np.float32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
READER_CONFIG = """
    name: "reader"
    backend: "python"
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
SIZE = 1 << 20  # every region here
COUNT = SIZE // 4  # FP32 elements in it


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = Path(tmp_path_factory.mktemp("truncation"))
    repo = tmp / "repo"
    write_model(repo, "plain", identity_config("plain"))
    write_model(repo, "reader", READER_CONFIG, files={"1/model.py": READER})
    with Server(tmp, repo, "--max-restarts", "0") as srv:
        yield srv
        assert srv.stop() == 0, srv.log()[-3000:]


@pytest.fixture(scope="module")
def figures() -> Iterator[dict[str, Counter[str]]]:
    tallies: dict[str, Counter[str]] = {}
    yield tallies
    record("truncation", {case: dict(t) for case, t in tallies.items()})


@contextlib.contextmanager
def own_object() -> Iterator[str]:
    """A POSIX object of this client's (SIZE bytes): its name."""
    name = f"ipt-trunc-{os.getpid()}-{secrets.token_hex(3)}"
    region = Region.create(name, SIZE)
    region.close()
    try:
        yield name
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


def outcome(run: Any) -> str:
    """What running ``run()`` came to: ok, or the error's code (a blamed death apart)."""
    try:
        with run():
            return "ok"
    except InferpoolError as err:
        if "which a client shrank while it was read" in err.message:
            return "SIGBUS blamed on the client"
        if "shrank" in err.message:
            return f"{err.code.value} (shrunk)"
        return f"{err.code.value}: {err.message}"


def still_serving(server: Server) -> None:
    """No model FAILED (--max-restarts 0: a counted death would have made one FAILED); each
    instance READY again."""
    wait_until(
        lambda: all(state == "READY" for _, _, state in workers(server).values()),
        "every instance ready",
    )
    with Client(server.endpoint, timeout=20) as c:
        out = c.infer("plain", {"INPUT0": np.arange(3, dtype=np.float32)})
        assert out["OUTPUT0"].tolist() == [0, 1, 2]


def tally(figures: dict[str, Counter[str]], case: str, got: str) -> None:
    figures.setdefault(case, Counter())[got] += 1


# ---------------------------------------------------------------------------- before
@pytest.mark.parametrize("path", ["input, broker path", "output window, broker path"])
def test_a_registered_object_shrunk_before_the_request(server, figures, path) -> None:
    before = workers(server)
    with own_object() as name, ShmClient(server.endpoint, input_bytes=SIZE, timeout=20) as c:
        c.register_system_shared_memory("mine", "/" + name, SIZE)
        req = c.request("plain", outputs=["OUTPUT0"])
        if path.startswith("input"):
            req.input_from("INPUT0", "mine", [COUNT], "FP32", SIZE)
        else:
            req.input("INPUT0", (COUNT,), np.float32)[:] = 1
            req.output_to("OUTPUT0", "mine", SIZE)
        shrink(name, 0)
        got = outcome(lambda: c.run(req))
        tally(figures, f"client's object ({path}), shrunk before", got)
        assert got == "INVALID_ARG (shrunk)", got
    assert workers(server) == before


@pytest.mark.parametrize("lane", [False, True])
def test_a_server_made_input_region_shrunk_before_the_request(server, figures, lane) -> None:
    before = workers(server)
    with ShmClient(server.endpoint, input_bytes=SIZE, lane=lane, timeout=20) as c:
        req = c.request("plain", outputs=["OUTPUT0"])
        req.input("INPUT0", (COUNT,), np.float32)[:] = 1  # written before the shrink
        region = c.session.region
        assert region is not None
        if lane:
            c.lane("plain")
        shrink(region.name, 0)
        got = outcome(lambda: c.run(req))
        shrink(region.name, SIZE)  # as large again: the client may touch it
        path = "lane" if lane else "broker path"
        tally(figures, f"server-made input region ({path}), shrunk before", got)
        assert got == "INVALID_ARG (shrunk)", got
    assert workers(server) == before


@pytest.mark.parametrize("end", ["close_lane", "disconnect", "nothing"])
def test_a_lane_region_shrunk_then(server, figures, end) -> None:
    shrink_a_lane_then(server, end)
    tally(figures, f"lane region, shrunk then {end}", "lane ended, worker lived")
    still_serving(server)


# ---------------------------------------------------------------------------- while read
def race(client: ShmClient, req: Any, name: str) -> str:
    """Run ``req`` (its input in object ``name``) while another thread shrinks the object at
    a random moment of the read; grow it back after."""
    delay = random.uniform(0, 0.02)
    shrinker = threading.Timer(delay, shrink, (name, 0))
    shrinker.start()
    try:
        return outcome(lambda: client.run(req))
    finally:
        shrinker.join()
        shrink(name, SIZE)


@pytest.mark.parametrize("made", ["client's object", "server-made region"])
def test_regions_shrunk_while_a_model_reads_them(server, figures, made) -> None:
    """Every race ends refused by name, answered (read first), or blamed on the client; the
    model is never FAILED (--max-restarts 0), and it serves after each.  The server-made
    region is read over a lane until a death is blamed on the client (which then gets no
    lanes: its requests take the broker path)."""
    got: Counter[str] = Counter()
    barred = False  # from lanes, once a death over a lane was blamed on this process
    with contextlib.ExitStack() as stack:
        name = "" if made == "server-made region" else stack.enter_context(own_object())
        for _ in range(RACES):
            with ShmClient(server.endpoint, input_bytes=SIZE, timeout=30) as c:
                req = c.request("reader", outputs=["OUTPUT0"])
                path = "broker path"
                if name:
                    c.register_system_shared_memory("mine", "/" + name, SIZE)
                    req.input_from("INPUT0", "mine", [COUNT], "FP32", SIZE)
                    target = name
                else:
                    req.input("INPUT0", (COUNT,), np.float32)[:] = 1
                    region = c.session.region
                    assert region is not None
                    target = region.name
                    if not barred:
                        try:
                            c.lane("reader")
                            path = "lane"
                        except InferpoolError as err:
                            assert "gets no lanes any more" in err.message, err.message
                            barred = True
                result = race(c, req, target)
            got[result] += 1
            tally(figures, f"{made} ({path}), shrunk while read", result)
            still_serving(server)
    assert set(got) <= {"ok", "INVALID_ARG (shrunk)", "SIGBUS blamed on the client"}, got
