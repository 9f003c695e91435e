"""Python models that record what they saw, for tests that watch the scheduler from a backend.

A recording model appends one JSON object per event to ``seen.jsonl`` in its model directory
(``args["model_repository"]``); :func:`seen` reads them back.  A request names itself with
the ``tag`` request parameter.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

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
