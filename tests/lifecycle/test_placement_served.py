"""Served models land where they were asked to: host policies, the default spread, --pin none,
torch threads and passive instances, read from inside each worker and from /proc; and the
GPU memory-fraction check at load (--model-load-gpu-limit), which needs a GPU.

This machine (and most CI machines) has one NUMA node, so the memory-policy calls are
exercised against node 0; other nodes are covered by the parsing and validation tests in
tests/unit/test_placement.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from inferpool.broker.pool.topology import Topology, format_cpu_list, parse_cpu_list
from tests.lifecycle.helpers import REPORT, TORCH, act, instance, write_act_model
from tests.support import ROOT, Server, serving

TOPO = Topology.discover()
NODE0 = sorted(TOPO.nodes[0])
LAST = TOPO.cpus[-1]


def proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


def proc_mempolicy(pid: int) -> set[str]:
    """The memory policies /proc/<pid>/numa_maps shows for the process's anonymous heap:
    mappings without a policy of their own show the task's policy (e.g. ``bind:0``)."""
    with open(f"/proc/{pid}/numa_maps") as f:
        return {line.split()[1] for line in f if " heap " in line or " anon=" in line}


def pinned_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    write_act_model(repo, "numa", 'instance_group [ { kind: KIND_CPU host_policy: "node0" } ]')
    write_act_model(repo, "cores", 'instance_group [ { kind: KIND_CPU host_policy: "last" } ]')
    write_act_model(repo, "spread", "instance_group [ { count: 2 kind: KIND_CPU } ]")
    write_act_model(
        repo,
        "threads",
        'parameters { key: "INTRA_OP_THREAD_COUNT" value: { string_value: "2" } }',
    )
    write_act_model(
        repo,
        "passive",
        'instance_group [ { name: "active" kind: KIND_CPU }, '
        '{ name: "standby" kind: KIND_CPU passive: true } ]',
    )
    return repo


@pytest.fixture(scope="module")
def pinned():
    yield from serving(
        pinned_repo,
        "--host-policy=node0,numa-node=0",
        f"--host-policy=last,cpu-cores={LAST}",
    )


@pytest.fixture(scope="module")
def unpinned():
    def repo(tmp: Path) -> Path:
        write_act_model(tmp / "repo", "free")
        return tmp / "repo"

    yield from serving(repo, "--pin", "none")


def test_numa_node_policy_binds_memory_and_cores(pinned) -> None:
    with pinned.client() as c:
        row = instance(c, "numa_0_0")
        inside = act(c, "numa")
    assert inside["pid"] == row["pid"]
    assert inside["affinity"] == NODE0
    assert (inside["placement"]["mempolicy"], inside["placement"]["numa_nodes"]) == ("bind", [0])
    assert row["placement"]["mempolicy"] == "bind" and row["placement"]["numa_nodes"] == [0]
    assert parse_cpu_list(proc_status(row["pid"])["Cpus_allowed_list"]) == NODE0
    assert proc_mempolicy(row["pid"]) == {"bind:0"}
    assert row["pinning"] == {
        "cpus": NODE0,
        "numa_node": 0,
        "mempolicy": "bind",
        "cuda_visible_devices": None,
        "threads": 0,
    }


def test_cpu_cores_policy_pins_and_sizes_torch_threads(pinned) -> None:
    with pinned.client() as c:
        row = instance(c, "cores_0_0")
        inside = act(c, "cores", TORCH)
    assert inside["affinity"] == [LAST] == row["placement"]["cpus"]
    assert parse_cpu_list(proc_status(row["pid"])["Cpus_allowed_list"]) == [LAST]
    assert inside["placement"]["mempolicy"] == "default"
    assert proc_mempolicy(row["pid"]) == {"default"}
    assert inside["placement"]["threads_env"]["OMP_NUM_THREADS"] == "1"
    assert inside["torch_threads"] == 1  # one pinned core, one intra-op thread


def test_the_model_sets_its_own_thread_count(pinned) -> None:
    with pinned.client() as c:
        inside = act(c, "threads", TORCH)
    assert len(inside["affinity"]) == 1  # the default spread: one core
    assert inside["torch_threads"] == 2  # INTRA_OP_THREAD_COUNT wins over the core count


def test_default_spread_pins_each_instance_to_one_core(pinned) -> None:
    with pinned.client() as c:
        rows = [r for r in c.status() if r["model"] == "spread"]
    assert len(rows) == 2 and len({r["pid"] for r in rows}) == 2
    for row in rows:
        [core] = row["pinning"]["cpus"]
        assert core in TOPO.cpus
        assert parse_cpu_list(proc_status(row["pid"])["Cpus_allowed_list"]) == [core]
        assert row["placement"]["threads_env"]["OMP_NUM_THREADS"] == "1"
    if len(TOPO.cpus) >= 2:
        assert rows[0]["pinning"]["cpus"] != rows[1]["pinning"]["cpus"]


def test_passive_instance_is_loaded_but_never_scheduled(pinned) -> None:
    with pinned.client() as c:
        rows = {r["instance"]: r for r in c.status() if r["model"] == "passive"}
        assert rows["standby_0"]["state"] == "READY" and rows["standby_0"]["pid"]
        answered_by = {act(c, "passive", REPORT)["instance"] for _ in range(12)}
    assert answered_by == {"active_0"}


def test_status_command_shows_cores_numa_and_device(pinned) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "inferpool", "status", "--endpoint", pinned.endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    with pinned.client() as c:
        rows = [r for r in c.status() if r["pid"]]
    header, *lines = out.stdout.splitlines()
    assert header.split()[:9] == [
        "INSTANCE",
        "MODEL",
        "PID",
        "STATE",
        "CPUS",
        "NUMA",
        "DEVICE",
        "RESTARTS",
        "LAST",
    ]
    numa = next(line.split() for line in lines if line.startswith("numa_0_0 "))
    assert numa[4:8] == [format_cpu_list(NODE0), "0", "bind", "CPU"]
    cores = next(line.split() for line in lines if line.startswith("cores_0_0 "))
    assert cores[4:8] == [str(LAST), "-", "default", "CPU"]
    held = {c for r in rows for c in (r["placement"] or {}).get("cpus") or r["pinning"]["cpus"]}
    free = set(TOPO.cpus) - held
    assert lines[-1] == (
        f"cores held by workers: {format_cpu_list(sorted(held))}; held by none: "
        f"{format_cpu_list(sorted(free)) if free else 'none'} "
        "(a lane client spins on those: docs/performance.md, Lanes)"
    )


def test_pin_none_leaves_placement_to_the_os(unpinned) -> None:
    with unpinned.client() as c:
        row = instance(c, "free_0")
        inside = act(c, "free")
    allowed = sorted(os.sched_getaffinity(0))
    assert row["pinning"]["cpus"] == [] and row["pinning"]["mempolicy"] == ""
    assert inside["affinity"] == allowed
    assert parse_cpu_list(proc_status(row["pid"])["Cpus_allowed_list"]) == allowed
    assert inside["placement"]["mempolicy"] == "default"
    assert inside["placement"]["threads_env"] == {
        v: os.environ[v]
        for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
        if v in os.environ
    }


@pytest.mark.skipif(
    not torch.cuda.is_available() or not Topology.discover().gpus,
    reason="needs a CUDA GPU: torch.cuda.is_available() is false on this machine",
)
def test_a_gpu_instance_over_the_limit_is_unavailable_and_under_it_serves() -> None:
    for fraction, state in (("0.000001", "UNAVAILABLE"), ("0.99", "READY")):
        tmp = Path(tempfile.mkdtemp(prefix="ipt-", dir="/tmp"))
        try:
            write_act_model(tmp / "repo", "gpu", "instance_group [ { kind: KIND_GPU gpus: [0] } ]")
            args = ("--model-load-gpu-limit", f"0:{fraction}")
            with Server(tmp, tmp / "repo", *args) as server, server.client() as c:
                row = {r["name"]: r for r in c.models()}["gpu"]
                assert row["state"] == state, row
                if state == "UNAVAILABLE":
                    assert "memory limit set for KIND_GPU 0 has exceeded" in row["reason"]
                    [inst] = c.status()
                    assert inst["state"] == "FAILED" and inst["restarts"] == 0
            assert server.proc.returncode == 0
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
