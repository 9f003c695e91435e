"""Models that record what they saw, for tests that watch the scheduler from a backend.

A recording model appends one JSON object per event to ``seen.jsonl`` in its model directory;
:func:`seen` reads them back.  A request names itself with the ``tag`` request parameter.
:func:`model_py` makes a python model's model.py; :data:`PROBE` is a backend of its own
(``<model>/probe.py``, ``backend: "probe"``) that sees what only the backend API shows.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from tests.support import Server

RECORDER = """
import json
import os
import threading

_LOCK = threading.Lock()


class Recorder:
    def __init__(self, args):
        self.path = os.path.join(args["model_repository"], "seen.jsonl")

    def __call__(self, **event):
        with _LOCK, open(self.path, "a") as f:
            f.write(json.dumps(event) + "\\n")


def tag(request):
    return json.loads(request.parameters()).get("tag", request.request_id())
"""


# Records each request (tag, priority level, timeout, batch size); X[0] != 0 holds it until
# it is cancelled (at most 20 s).  Input X, output Y, any type and shape.
PROBE = """
import json
import os
import time

from inferpool.backends.api import Backend, Model, ModelInstance


class ProbeInstance(ModelInstance):
    def execute(self, requests):
        path = os.path.join(self.model.repository_path, "seen.jsonl")
        responses = []
        for request in requests:
            event = {
                "start": request.parameters.get("tag", request.id),
                "priority": request.priority,
                "timeout": request.timeout_us,
                "batch": len(requests),
            }
            with open(path, "a") as f:
                f.write(json.dumps(event) + "\\n")
            x = request.input("X").as_numpy()
            deadline = time.monotonic() + (20 if x.reshape(-1)[0] else 0)
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(0.005)
            response = request.response()
            response.set_output("Y", x)
            responses.append(response)
        return responses


class ProbeBackend(Backend):
    model_class = Model
    instance_class = ProbeInstance


BACKEND = ProbeBackend
"""


def model_py(body: str) -> str:
    """model.py source: the recorder, then ``body`` (which may use ``Recorder`` and ``tag``)."""
    return RECORDER + body


def seen(model_dir: Path) -> list[dict[str, Any]]:
    path = model_dir / "seen.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def wait_seen(model_dir: Path, event: dict[str, Any], timeout: float = 20.0) -> dict[str, Any]:
    """Until the model has recorded an event with every key/value of ``event``; returns it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for got in seen(model_dir):
            if all(got.get(k) == v for k, v in event.items()):
                return got
        time.sleep(0.02)
    raise AssertionError(f"model {model_dir.name} did not record {event} within {timeout}s")


def tags(model_dir: Path, key: str) -> list[Any]:
    """The ``key`` value of every event that has one, in order."""
    return [e[key] for e in seen(model_dir) if key in e]


class Served(NamedTuple):
    server: Server
    repo: Path  # the model repository it serves


@contextmanager
def served(
    prefix: str, build: Callable[[Path], None], *args: str, kserve: bool = False
) -> Iterator[Served]:
    """A server over the repository ``build`` writes (for a module's tests to share), with
    ``args`` and the KServe frontends when ``kserve``; the run must end cleanly, leaving no
    shared memory behind."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        repo = tmp / "repo"
        build(repo)
        with Server(tmp, repo, *args, kserve=kserve) as server:
            yield Served(server, repo)
        assert server.proc.returncode == 0, server.log()
        assert server.regions() == [], "the module's server left shared memory behind"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
