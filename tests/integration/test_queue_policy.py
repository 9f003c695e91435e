"""Priority levels and queue policies of the dynamic batcher, served for real and watched from
a backend that records the order it ran requests in and what each request carried
(tests.integration.recording.PROBE); a held request keeps the one instance busy while the
others queue, and cancelling it lets them through."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferpool.client import Client, Code, InferpoolError
from tests.integration.recording import PROBE, Served, seen, served, wait_seen
from tests.support import write_model

IO = """
    max_batch_size: 1
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
MODELS = {
    "prio": "dynamic_batching { priority_levels: 2 default_priority_level: 2 }",
    "bounded": "dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    # level 1 delays what times out, level 2 rejects it; a request may shorten the 10 s
    "timeouts": """dynamic_batching {
        priority_levels: 2 default_priority_level: 1
        default_queue_policy {
            default_timeout_microseconds: 10000000 allow_timeout_override: true
            timeout_action: DELAY }
        priority_queue_policy { key: 2 value: {
            default_timeout_microseconds: 10000000 allow_timeout_override: true
            timeout_action: REJECT } } }""",
    "bad_default": "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
}


def write_repository(repo: Path) -> None:
    for name, batching in MODELS.items():
        config = f'name: "{name}"\nbackend: "probe"\n{IO}\n{batching}'
        write_model(repo, name, config, files={"probe.py": PROBE})


@pytest.fixture(scope="module")
def live() -> Iterator[Served]:
    with served("ipq-", write_repository, "--exit-on-error=false") as got:  # bad_default fails
        yield got


def send(c: Client, model: str, tag: str, hold: bool = False, **params: Any) -> str:
    """An infer request not waited for (``hold``: the probe keeps it until it is cancelled)."""
    return c._send(
        {
            "type": "infer",
            "model_name": model,
            "inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1]}],
            "parameters": {"tag": tag, **params},
        },
        [np.array([[int(hold)]], np.int32).data],
    )


def answer(c: Client, request_id: str) -> dict[str, Any]:
    return dict(c._recv(request_id, 20)[0])


def hold(c: Client, model_dir: Path) -> str:
    """Occupy the instance: a held request, running once the probe has recorded it."""
    tag = uuid.uuid4().hex
    request_id = send(c, model_dir.name, tag, hold=True)
    wait_seen(model_dir, {"start": tag})
    return request_id


def release(c: Client, held: str) -> None:
    assert c.call("cancel", request_id=held)["cancelled"] == 1
    assert answer(c, held)["error"]["code"] == "CANCELLED"


def started(model_dir: Path, tags: list[str]) -> list[dict[str, Any]]:
    """The probe's records of ``tags``, in the order they ran."""
    return [e for e in seen(model_dir) if e.get("start") in tags]


def test_higher_priority_runs_first_and_the_backend_sees_its_level(live: Served) -> None:
    model_dir = live.repo / "prio"
    tags = [f"{name}-{uuid.uuid4().hex[:6]}" for name in ("low", "low2", "none", "high", "huge")]
    with live.server.client() as c:
        held = hold(c, model_dir)
        low, low2, none, high, huge = tags
        ids = [
            send(c, "prio", low, priority=2),
            send(c, "prio", low2, priority=2),
            send(c, "prio", none),  # no priority: the default level, 2
            send(c, "prio", high, priority=1),
            send(c, "prio", huge, priority=9),  # above priority_levels: the default level
        ]
        release(c, held)
        for request_id in ids:
            assert "error" not in answer(c, request_id)
    ran = started(model_dir, tags)
    assert [e["start"] for e in ran] == [high, low, low2, none, huge]
    assert [e["priority"] for e in ran] == [1, 2, 2, 2, 2]


def test_a_full_queue_refuses_with_tritons_words(live: Served) -> None:
    with live.server.client() as c:
        held = hold(c, live.repo / "bounded")
        waiting = send(c, "bounded", "waits")
        with pytest.raises(InferpoolError, match=r"Exceeds maximum queue size") as err:
            c.infer("bounded", {"X": np.zeros((1, 1), np.int32)})
        assert err.value.code is Code.UNAVAILABLE
        assert "max_queue_size 1" in err.value.message
        release(c, held)
        assert "error" not in answer(c, waiting)


def test_timeouts_delay_at_one_level_and_reject_at_another(live: Served) -> None:
    model_dir = live.repo / "timeouts"
    late, on_time, rejected, kept = (f"{n}-{uuid.uuid4().hex[:6]}" for n in "abcd")
    with live.server.client() as c:
        held = hold(c, model_dir)
        # a 1 us timeout expires before the next request arrives: at level 1 it is delayed
        # behind the requests that have not expired, at level 2 it is rejected
        ids = [
            send(c, "timeouts", late, timeout=1),
            send(c, "timeouts", on_time),
            send(c, "timeouts", rejected, priority=2, timeout=1),
            send(c, "timeouts", kept, priority=2),
        ]
        error = answer(c, ids[2])["error"]
        assert error["code"] == "UNAVAILABLE"
        assert error["message"].startswith("Request timeout expired")
        release(c, held)
        for request_id in (ids[0], ids[1], ids[3]):
            assert "error" not in answer(c, request_id)
    ran = started(model_dir, [late, on_time, rejected, kept])
    assert [e["start"] for e in ran] == [on_time, late, kept]
    assert [e["timeout"] for e in ran] == [0, 1, 0]  # what each request asked for


def test_bad_priority_settings_are_refused(live: Served) -> None:
    with live.server.client() as c:
        reasons = {m["name"]: m["reason"] for m in c.models()}
        assert (
            "default priority level must be in range [1, 2] for bad_default"
            in (reasons["bad_default"])
        )
        for bad in (-1, "high", True, 1.5):
            with pytest.raises(InferpoolError, match="priority must be a non-negative integer"):
                c.infer("prio", {"X": np.zeros((1, 1), np.int32)}, parameters={"priority": bad})
