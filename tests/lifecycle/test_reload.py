"""SIGHUP reloads the repository while clients keep sending: no request fails.

Unchanged models keep their workers; a changed model is replaced (new workers first, then the
switch, then the old ones drain); a new model loads; a removed model serves what it had
queued and then unloads; a broken new configuration leaves the old one serving.
"""

from __future__ import annotations

import shutil
import signal
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError
from tests.lifecycle.helpers import REPORT, Stream, act, write_act_model
from tests.support import identity_config, serving, wait_until, write_model


def repo(tmp: Path) -> Path:
    root = tmp / "repo"
    write_model(
        root,
        "steady",
        identity_config(
            "steady", extra='parameters { key: "execute_delay_ms" value: { string_value: "5" } }'
        ),
    )
    write_model(
        root,
        "gone",
        identity_config(
            "gone", extra='parameters { key: "execute_delay_ms" value: { string_value: "300" } }'
        ),
    )
    write_act_model(root, "changing", value=1)
    return root


@pytest.fixture(scope="module")
def server():
    yield from serving(repo)


def _serves(c: Client, value: int) -> bool:
    """Model 'changing' answers with ``value``: its reload is served."""
    return bool(act(c, "changing")["value"] == value)


def pids(c, model: str) -> set[int]:
    return {r["pid"] for r in c.status() if r["model"] == model}


def test_sighup_reloads_what_changed_without_failing_a_request(server) -> None:
    root = Path(server.proc.args[server.proc.args.index("--model-repository") + 1])
    with server.client() as c:
        steady_pids, changing_pids = pids(c, "steady"), pids(c, "changing")
        steady = Stream(server, "steady", lambda: {"INPUT0": np.arange(4, dtype=np.float32)})
        changing = Stream(server, "changing", lambda: {"ACT": np.array([REPORT], np.int32)})
        try:
            wait_until(lambda: len(changing.results) > 5 and len(steady.results) > 5)
            write_act_model(root, "changing", value=20)  # a new size: no stale .pyc
            write_model(root, "newcomer", identity_config("newcomer"))
            # three requests for "gone": one executing, two queued when the reload starts
            held = [c._send(_infer_gone(), [np.ones(2, np.float32).data]) for _ in range(3)]
            c.call("health_live")  # answered after the broker admitted all three
            shutil.rmtree(root / "gone")
            server.proc.send_signal(signal.SIGHUP)
            for rid in held:
                header, _ = c._recv(rid, 20)
                assert "error" not in header, header
            wait_until(lambda: act(c, "changing")["value"] == 20, what="the new changing")
            wait_until(lambda: "gone" not in {r["name"] for r in c.models()}, what="gone unloaded")
            wait_until(lambda: c.is_model_ready("newcomer"), what="the newcomer loaded")
            wait_until(lambda: len(pids(c, "changing")) == 1, what="the old workers stopped")
            seen = len(changing.results)
            wait_until(lambda: len(changing.results) > seen + 5)
        finally:
            steady.stop()
            changing.stop()
        assert steady.errors == [] and changing.errors == []
        values = [int(_info(r)["value"]) for r in changing.results]
        assert values[0] == 1 and values[-1] == 20 and values == sorted(values)
        assert pids(c, "steady") == steady_pids  # unchanged: not touched
        assert pids(c, "changing").isdisjoint(changing_pids)
        with pytest.raises(InferpoolError, match="unknown model") as err:
            c.infer("gone", {"INPUT0": np.ones(2, np.float32)})
        assert err.value.code.value == "NOT_FOUND"
        # statistics carry on across the reload (they count the old version's answers too)
        assert c.statistics("changing")["model_stats"][0]["inference_count"] >= len(values)


def test_a_broken_new_config_leaves_the_old_one_serving(server) -> None:
    root = Path(server.proc.args[server.proc.args.index("--model-repository") + 1])
    with server.client() as c:
        before = pids(c, "changing")
        changing = Stream(server, "changing", lambda: {"ACT": np.array([REPORT], np.int32)})
        try:
            (root / "changing" / "1" / "model.py").write_text("raise RuntimeError('oops')\n")
            server.proc.send_signal(signal.SIGHUP)
            wait_until(
                lambda: "reload failed" in {r["name"]: r for r in c.models()}["changing"]["reason"],
                what="the failed reload noted",
            )
            seen = len(changing.results)
            wait_until(lambda: len(changing.results) > seen + 3, what="served on after it")
        finally:
            changing.stop()
        assert changing.errors == []
        row = {r["name"]: r for r in c.models()}["changing"]
        assert row["state"] == "READY"
        assert "serving the previous configuration" in row["reason"] and "oops" in row["reason"]
        assert pids(c, "changing") == before
        assert act(c, "changing")["value"] == 20


def test_reloads_under_load_leave_no_region_behind(server) -> None:
    """Each reload replaces the changed model's workers; the output regions of the replaced
    ones go with them, so the run's regions come back to what one load makes."""
    root = Path(server.proc.args[server.proc.args.index("--model-repository") + 1])
    with server.client() as c:
        changing = Stream(server, "changing", lambda: {"ACT": np.array([REPORT], np.int32)})
        try:
            for value in (300, 4000, 50000):  # new sizes: no stale .pyc
                write_act_model(root, "changing", value=value)
                server.proc.send_signal(signal.SIGHUP)
                wait_until(partial(_serves, c, value), what="reloaded")
                wait_until(lambda: len(pids(c, "changing")) == 1, what="the old workers stopped")
        finally:
            changing.stop()
        assert changing.errors == []
        workers = sum(1 for r in c.status() if r["pid"])
        wait_until(
            lambda: sum("-out" in r for r in server.regions()) == workers,
            what=f"one output region for each of the {workers} workers",
        )


def _infer_gone() -> dict:
    return {
        "type": "infer",
        "model_name": "gone",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2]}],
    }


def _info(result) -> dict:
    import json

    return json.loads(result["INFO"][0])
