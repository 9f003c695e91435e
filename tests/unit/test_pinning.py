"""Worker-side pinning, checked from inside fresh processes against what the kernel reports.

Each case starts a new interpreter that applies a PinningSpec and prints read_back() (or the
error) as JSON, so the test process itself is never re-pinned.  The policy calls are made
against node 0 and the last usable core, which exist on any machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from inferpool.broker.pool.placement import parse_host_policies, plan_instances
from inferpool.broker.pool.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
CORES = sorted(os.sched_getaffinity(0))
LAST = CORES[-1]

APPLY = """
import json, sys
from inferpool.wire.errors import InferpoolError
from inferpool.workers.pinning import apply, read_back
from inferpool.wire.worker.spec import PinningSpec
spec = PinningSpec(**json.loads(sys.argv[1]))
try:
    applied = apply(spec, policy=sys.argv[2])
except InferpoolError as err:
    print(json.dumps({"error": err.to_wire()}))
else:
    print(json.dumps({"back": read_back(), "torch_threads": applied.torch_threads,
                      "warnings": list(applied.warnings), "device3": applied.device(3)}))
"""


def run(code: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def pin(policy: str = "", env: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return run(APPLY, json.dumps(spec), policy, env=env)


def test_what_runs_before_the_pinning_imports_only_the_stdlib_and_orjson() -> None:
    got = run(
        "import json, sys, inferpool.workers.main;"
        " print(json.dumps(sorted(m for m in sys.modules if m.removeprefix('inferpool.')"
        ".split('.')[0] in ('numpy', 'torch', 'zmq', 'cupy', 'broker', 'backends', 'shm',"
        " 'google', 'tritonclient'))))"
    )
    assert got == []


def test_nothing_asked_changes_nothing() -> None:
    got = pin()
    assert got["back"]["cpus"] == CORES
    assert got["back"]["mempolicy"] == "default" and got["back"]["numa_nodes"] == []
    assert got["torch_threads"] == 0


def test_one_core_and_bind_to_node0() -> None:
    got = pin("node0", cpus=[LAST], numa_node=0, mempolicy="bind")
    back = got["back"]
    assert back["cpus"] == [LAST]
    assert (back["mempolicy"], back["numa_nodes"]) == ("bind", [0])
    assert back["threads_env"] == {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    assert got["torch_threads"] == 1 and got["warnings"] == []


def test_preferred_node0_and_explicit_threads() -> None:
    got = pin(cpus=CORES, numa_node=0, mempolicy="preferred", threads=3)
    assert (got["back"]["mempolicy"], got["back"]["numa_nodes"]) == ("preferred", [0])
    assert got["back"]["cpus"] == CORES
    assert got["back"]["threads_env"]["OMP_NUM_THREADS"] == "3" and got["torch_threads"] == 3


def test_torch_imported_before_the_pinning_takes_its_thread_count() -> None:
    """A worker forked from a zygote finds torch imported (with the zygote's variables)."""
    code = "import torch\n" + APPLY + "print(torch.get_num_threads())\n"
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps({"cpus": [LAST]}), ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OMP_NUM_THREADS": "2"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "1"


def test_interleave_without_a_node_spans_the_online_nodes() -> None:
    got = pin(mempolicy="interleave")
    assert got["back"]["mempolicy"] == "interleave"
    assert got["back"]["numa_nodes"] == sorted(Topology.discover().nodes)


def test_bind_then_preferred_in_one_process() -> None:
    code = """
import json
from inferpool.workers.pinning import apply, read_back
from inferpool.wire.worker.spec import PinningSpec
seen = []
for mode in ("bind", "preferred", "bind"):
    apply(PinningSpec(cpus=[CORE], numa_node=0, mempolicy=mode))
    back = read_back()
    seen.append([back["mempolicy"], back["numa_nodes"], back["cpus"]])
print(json.dumps(seen))
""".replace("CORE", str(LAST))
    assert run(code) == [["bind", [0], [LAST]], ["preferred", [0], [LAST]], ["bind", [0], [LAST]]]


def test_cuda_visible_devices_and_the_local_device() -> None:
    got = pin(cuda_visible_devices="3", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert got["back"]["cuda_visible_devices"] == "3"
    assert got["device3"] == 0  # Triton device 3 is CUDA ordinal 0 once narrowed
    assert pin()["device3"] == 3


def test_affinity_covers_threads_that_already_run() -> None:
    code = """
import json, threading, os
from inferpool.workers.pinning import apply
from inferpool.wire.worker.spec import PinningSpec
ready, stop = threading.Event(), threading.Event()
tid = []
def body():
    tid.append(threading.get_native_id()); ready.set(); stop.wait()
t = threading.Thread(target=body); t.start(); ready.wait()
applied = apply(PinningSpec(cpus=[CORE], numa_node=0, mempolicy="bind"))
with open(f"/proc/self/task/{tid[0]}/status") as f:
    line = next(l for l in f if l.startswith("Cpus_allowed_list"))
stop.set(); t.join()
print(json.dumps({"other": line.split()[1], "warnings": list(applied.warnings)}))
""".replace("CORE", str(LAST))
    got = run(code)
    assert got["other"] == str(LAST)
    assert any("threads running" in w for w in got["warnings"])


def test_a_core_that_does_not_exist_is_a_clear_error() -> None:
    bad = max(LAST + 1, 1023)
    got = pin("pool", cpus=[bad])
    assert got["error"]["code"] == "UNAVAILABLE"
    message = got["error"]["message"]
    assert message.startswith("cannot apply host policy 'pool': sched_setaffinity to cores")
    assert str(bad) in message and f"may use cores {CORES[0]}" in message


def test_numa_errors_name_the_policy_and_what_is_allowed() -> None:
    got = pin("far", numa_node=63, mempolicy="bind")
    assert got["error"]["code"] == "UNAVAILABLE"
    message = got["error"]["message"]
    assert "host policy 'far'" in message and "set_mempolicy(bind, node 63)" in message
    assert "nodes this process may use: " in message
    assert "needs a numa_node" in pin(mempolicy="bind")["error"]["message"]
    assert "'spread' is not one of" in pin(numa_node=0, mempolicy="spread")["error"]["message"]
    assert "out of range" in pin(numa_node=5000, mempolicy="bind")["error"]["message"]


def test_what_the_broker_plans_is_what_the_worker_gets() -> None:
    topo = Topology.discover()
    node = min(topo.nodes)
    cfg = text_format.Parse(
        'name: "m" instance_group [{count: 2 kind: KIND_CPU}, '
        '{kind: KIND_CPU host_policy: "local"}]',
        model_config_pb2.ModelConfig(),
    )
    policies = parse_host_policies([f"local,numa-node={node}"], topo)
    for placement in plan_instances(cfg, topo, policies):
        asked = placement.pinning
        back = pin(placement.host_policy, **dataclasses.asdict(asked))["back"]
        assert back["cpus"] == sorted(asked.cpus)
        expected = (asked.mempolicy or "default", [node] if asked.mempolicy else [])
        assert (back["mempolicy"], back["numa_nodes"]) == expected
