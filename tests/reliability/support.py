"""What the reliability tests share: a served repository, a probe that sends batches of raw
messages and checks each reply, the broker's resource counts, and the figures they record.

``INFERPOOL_LONG_TESTS=1`` makes the runs long (the figures of docs/reliability.md);
``INFERPOOL_RELIABILITY_REPORT=<file>`` makes each test add its figures to that JSON file
(``scripts/reliability_report.py`` reads it).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from inferpool.client import Client
from tests.support import identity_config, write_model

LONG = os.environ.get("INFERPOOL_LONG_TESTS") == "1"
REPORT = os.environ.get("INFERPOOL_RELIABILITY_REPORT", "")
IDLE = {
    "arena_slots": 0,
    "output_slots_held": 0,
    "leases": 0,
    "registrations": 0,
    "inflight": 0,
    "lanes": 0,
}
SERVER_CODES = {
    "INVALID_ARG",
    "NOT_FOUND",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "TIMEOUT",
    "ALREADY_EXISTS",
}


def reliability_repo(tmp: Path) -> Path:
    """Plain, batched, BYTES and sequence models: the shapes of request hostile input meets."""
    repo = tmp / "repo"
    write_model(repo, "identity", identity_config("identity"))
    write_model(
        repo,
        "batched",
        identity_config(
            "batched",
            max_batch=8,
            extra="dynamic_batching { max_queue_delay_microseconds: 500 }\n"
            "instance_group [ { count: 2 kind: KIND_CPU } ]",
        ),
    )
    write_model(repo, "strings", identity_config("strings", datatype="TYPE_STRING"))
    write_model(repo, "seq", identity_config("seq", max_batch=4, extra="sequence_batching { }"))
    return repo


def resources(client: Client) -> dict[str, int]:
    counts = client.statistics()["resources"]
    return {key: counts[key] for key in IDLE}


def wait_idle(client: Client, timeout: float = 20.0) -> dict[str, int]:
    """Until the broker holds nothing for clients (AssertionError naming what it still
    holds after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        held = resources(client)
        if held == IDLE or time.monotonic() > deadline:
            assert held == IDLE, f"the broker still holds {held}"
            return held
        time.sleep(0.05)


@dataclass
class Message:
    """One message to send and what its reply must be: "error", "ok" or "any"."""

    frames: list[bytes]
    expect: str = "error"
    id: str = ""  # the id it carries, when its reply can be matched to it


@dataclass
class Tally:
    """What a run sent and got back."""

    sent: int = 0
    answered: int = 0
    codes: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"sent": self.sent, "answered": self.answered, "codes": dict(self.codes)}


class Probe:
    """Sends a batch of messages on a fresh DEALER socket and checks every reply."""

    def __init__(self, endpoint: str, tally: Tally) -> None:
        self.endpoint = endpoint
        self.tally = tally
        self.ctx: zmq.Context[Any] = zmq.Context.instance()

    def exchange(self, messages: list[Message], timeout: float = 30.0) -> None:
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        try:
            for msg in messages:
                sock.send_multipart(msg.frames)
            self.tally.sent += len(messages)
            replies: list[list[bytes]] = []
            deadline = time.monotonic() + timeout
            while len(replies) < len(messages):
                left = int((deadline - time.monotonic()) * 1000)
                assert left > 0 and sock.poll(left), (
                    f"{len(messages) - len(replies)} of {len(messages)} messages unanswered"
                )
                replies.append(sock.recv_multipart())
            assert not sock.poll(20), "more replies than messages"
        finally:
            sock.close()
        self.tally.answered += len(replies)
        self._check(messages, replies)

    def _check(self, messages: list[Message], replies: list[list[bytes]]) -> None:
        by_id = {m.id: m for m in messages if m.id}
        unmatched = [m for m in messages if not m.id]
        unmatched_errors = 0
        for frames in replies:
            delimiter = frames.index(b"") if b"" in frames else -1
            assert 0 <= delimiter < len(frames) - 1, frames[:3]
            header = json.loads(frames[delimiter + 1])
            error = header.get("error")
            code = error["code"] if error else "ok"
            self.tally.codes[code] += 1
            if error is not None:
                assert error["code"] in SERVER_CODES, header
            msg = by_id.pop(str(header.get("id")), None)
            if msg is None:  # an id that is not one of ours: the message had none to echo
                unmatched_errors += error is not None
            elif msg.expect == "error":
                assert error is not None, (msg.frames[:2], header)
            elif msg.expect == "ok":
                assert error is None, (msg.frames[:2], header)
        assert not by_id, f"unanswered: {list(by_id)[:5]}"
        must_fail = sum(m.expect == "error" for m in unmatched)
        assert unmatched_errors >= must_fail, f"{must_fail - unmatched_errors} not refused"


def record(name: str, figures: dict[str, Any]) -> None:
    """Add a test's figures to the report file, if one was asked for."""
    if not REPORT:
        return
    path = Path(REPORT)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=1))


@contextlib.contextmanager
def unchanged_workers(client: Client) -> Any:
    """No message may kill a worker: every instance is the same process afterwards."""
    before = {r["instance"]: (r["pid"], r["restarts"]) for r in client.status()}
    yield
    after = {r["instance"]: (r["pid"], r["restarts"]) for r in client.status()}
    assert after == before, f"workers changed: {before} -> {after}"
