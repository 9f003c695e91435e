"""Host policy parsing, instance planning and topology discovery (broker side).

A 16-core, 2-node, 2-GPU machine is described as data (a Topology) where the test needs
one; the rest runs against this machine's real topology.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from inferpool.broker.pool.instance_groups import complete_groups
from inferpool.broker.pool.placement import (
    CoreUsage,
    HostPolicy,
    parse_host_policies,
    parse_host_policy,
    plan_instances,
)
from inferpool.broker.pool.topology import Topology, format_cpu_list, parse_cpu_list, visible_gpus
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.spec import InstanceSpec, PinningSpec

ROOT = Path(__file__).resolve().parents[2]
BIG = Topology(
    cpus=tuple(range(16)),
    nodes={0: tuple(range(8)), 1: tuple(range(8, 16))},
    gpus=("0", "1"),
)
CPUS16 = dataclasses.replace(BIG, gpus=())  # KIND_AUTO (the default) resolves to CPU here
HERE = Topology.discover()


def config(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def invalid(fn, *args, **kwargs) -> str:
    with pytest.raises(InferpoolError) as info:
        fn(*args, **kwargs)
    assert info.value.code == Code.INVALID_ARG
    return info.value.message


# ---------------------------------------------------------------------------- cpu lists
@pytest.mark.parametrize(
    "text, cpus",
    [("0-3,5", [0, 1, 2, 3, 5]), ("7", [7]), ("0-1, 4-5 ,9", [0, 1, 4, 5, 9])],
)
def test_cpu_list_round_trip(text: str, cpus: list[int]) -> None:
    assert parse_cpu_list(text) == cpus
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus
    assert parse_cpu_list("") == [] and format_cpu_list([]) == "none"


def test_cpu_list_rejects_garbage() -> None:
    for bad in ("a", "1-", "3-1", "1;2"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)


# ---------------------------------------------------------------------------- host policies
def test_parse_numa_node_and_cpu_cores() -> None:
    assert parse_host_policy("gpu_1,numa-node=1", BIG) == HostPolicy("gpu_1", 1, ())
    assert parse_host_policy("pool,cpu-cores=0-3,5", BIG) == HostPolicy(
        "pool", None, (0, 1, 2, 3, 5)
    )
    # several settings in one flag; a bare item continues the cpu-cores value before it
    both = parse_host_policy("p,cpu-cores=8-9,12,numa-node=1", BIG)
    assert both == HostPolicy("p", 1, (8, 9, 12))


def test_repeated_flags_merge_like_triton() -> None:
    got = parse_host_policies(
        ["gpu_0,numa-node=0", "gpu_0,cpu-cores=0-3", "gpu_1,numa-node=1", "gpu_0,cpu-cores=4"],
        BIG,
    )
    assert got == {"gpu_0": HostPolicy("gpu_0", 0, (4,)), "gpu_1": HostPolicy("gpu_1", 1, ())}


@pytest.mark.parametrize(
    "text, needles",
    [
        ("pool", ["--host-policy=pool", "NAME,KEY=VALUE", "numa-node", "cpu-cores"]),
        (",numa-node=0", ["NAME,KEY=VALUE"]),
        ("pool,numa_node=0", ["unknown key 'numa_node'", "valid keys: numa-node, cpu-cores"]),
        ("pool,numa-node=2", ["numa-node '2'", "not a NUMA node", "valid: 0, 1"]),
        ("pool,numa-node=x", ["numa-node 'x'", "valid: 0, 1"]),
        ("pool,cpu-cores=14-17", ["cpu-cores '14-17'", "16-17", "valid cores: 0-15"]),
        ("pool,cpu-cores=3-1", ["cpu-cores '3-1'", "backwards", "0-3,5"]),
        ("pool,cpu-cores=", ["cpu-cores is empty"]),
        ("pool,5", ["'5' is not KEY=VALUE"]),
    ],
)
def test_bad_host_policy_names_flag_key_and_what_is_valid(text: str, needles: list[str]) -> None:
    message = invalid(parse_host_policy, text, BIG)
    assert message.startswith(f"--host-policy={text}:")
    for needle in needles:
        assert needle in message


def test_merge_error_names_the_flag_that_was_wrong() -> None:
    message = invalid(parse_host_policies, ["p,numa-node=0", "p,cpu-cores=99"], BIG)
    assert message.startswith("--host-policy=p,cpu-cores=99:")


def test_host_policy_against_this_machine() -> None:
    node = min(HERE.nodes)
    assert parse_host_policy(f"n,numa-node={node}").numa_node == node
    last = max(HERE.cpus)
    assert parse_host_policy(f"c,cpu-cores={last}").cpu_cores == (last,)
    message = invalid(parse_host_policy, f"c,cpu-cores={last + 1}")
    assert f"valid cores: {format_cpu_list(HERE.cpus)}" in message
    message = invalid(parse_host_policy, f"n,numa-node={max(HERE.nodes) + 1}")
    assert "not a NUMA node of this machine" in message


# ---------------------------------------------------------------------------- topology
def test_topology_discovery_matches_the_kernel() -> None:
    assert HERE.cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert HERE.nodes, "at least one NUMA node"
    covered = sorted(c for cpus in HERE.nodes.values() for c in cpus)
    assert covered == sorted(HERE.cpus)  # every usable core belongs to exactly one node
    if Path("/sys/devices/system/node/node0").exists():
        assert 0 in HERE.nodes
    assert all(isinstance(g, str) for g in HERE.gpus)


def test_visible_gpus_reads_cuda_visible_devices_like_cuda() -> None:
    assert visible_gpus(0, None) == ()
    assert visible_gpus(4, None) == ("0", "1", "2", "3")
    assert visible_gpus(4, "2,3") == ("2", "3")
    assert visible_gpus(4, "1,7,2") == ("1",)  # CUDA stops at the first invalid index
    assert visible_gpus(4, "-1") == ()
    assert visible_gpus(4, "") == ()
    assert visible_gpus(2, "GPU-8a1b,MIG-3c") == ("GPU-8a1b", "MIG-3c")


def test_broker_side_imports_nothing_of_the_worker_or_torch() -> None:
    code = (
        "import sys, inferpool.broker.pool.placement, inferpool.broker.pool.topology; "
        "bad = sorted(m for m in sys.modules if m.removeprefix('inferpool.').split('.')[0] "
        "in ('workers', 'backends', 'torch', 'cupy', 'numpy')); "
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- planning
def test_names_kinds_and_spec_fields() -> None:
    cfg = config(
        'name: "m" instance_group [{count: 2 kind: KIND_CPU},'
        ' {name: "fast" kind: KIND_MODEL passive: true'
        "  secondary_devices [{kind: KIND_NVDLA device_id: 1}]}]"
    )
    plan = plan_instances(cfg, BIG)
    assert [(p.name, p.group, p.kind, p.index, p.host_policy) for p in plan] == [
        ("m_0_0", "m_0", "CPU", 0, "cpu"),
        ("m_0_1", "m_0", "CPU", 1, "cpu"),
        ("fast_0", "fast", "MODEL", 2, "model"),
    ]
    assert plan[2].passive and not plan[0].passive
    assert plan[2].secondary_devices == [{"kind": "KIND_NVDLA", "device_id": 1}]
    for p in plan:  # the parts of the worker spec, as wire.worker.spec types them
        assert isinstance(p.pinning, PinningSpec)
        assert p.instance() == InstanceSpec(
            p.name, p.kind, p.device_id, p.index, p.host_policy, p.passive, p.secondary_devices
        )


def test_no_instance_group_means_one_group_named_after_the_model() -> None:
    (only,) = plan_instances(config('name: "solo"'), CPUS16)
    assert (only.name, only.group, only.kind, only.device_id) == ("solo_0", "solo", "CPU", 0)
    # the caller's config is left as it was
    cfg = config('name: "solo"')
    plan_instances(cfg, BIG)
    assert len(cfg.instance_group) == 0


def test_count_zero_means_one_and_ensembles_have_no_instances() -> None:
    assert len(plan_instances(config('name: "z" instance_group [{count: 0}]'), CPUS16)) == 1
    ensemble = config('name: "e" platform: "ensemble" ensemble_scheduling {}')
    assert plan_instances(ensemble, BIG) == []


def test_default_spreads_one_core_each_across_models() -> None:
    usage = CoreUsage()
    small = Topology(cpus=(0, 1, 2, 3), nodes={0: (0, 1, 2, 3)})
    a = plan_instances(config('name: "a" instance_group [{count: 3}]'), small, usage=usage)
    b = plan_instances(config('name: "b" instance_group [{count: 2}]'), small, usage=usage)
    assert [p.pinning.cpus for p in a] == [[0], [1], [2]]
    assert [p.pinning.cpus for p in b] == [[3], [0]]
    assert all(p.pinning.mempolicy == "" and p.pinning.threads == 0 for p in a + b)
    usage.release(a)  # model a unloads: its cores are free again
    c = plan_instances(config('name: "c" instance_group [{count: 3}]'), small, usage=usage)
    assert [p.pinning.cpus for p in c] == [[1], [2], [0]]


def test_default_spread_on_this_machine_uses_every_core_before_doubling_up() -> None:
    n = len(HERE.cpus)
    plan = plan_instances(config(f'name: "m" instance_group [{{count: {n + 1}}}]'), HERE)
    cores = [p.pinning.cpus for p in plan]
    assert sorted(c[0] for c in cores[:n]) == list(HERE.cpus)
    assert cores[n] == [HERE.cpus[0]]


def test_host_policies_pin_and_bind() -> None:
    policies = parse_host_policies(
        ["node1,numa-node=1", "pool,cpu-cores=0-3,5", "both,numa-node=0,cpu-cores=6-7"], BIG
    )
    cfg = config(
        'name: "m" instance_group ['
        ' {count: 2 host_policy: "node1"}, {host_policy: "pool"}, {host_policy: "both"}]'
    )
    p = plan_instances(cfg, CPUS16, policies)
    assert (
        p[0].pinning
        == p[1].pinning
        == PinningSpec(
            cpus=list(range(8, 16)),
            numa_node=1,
            mempolicy="bind",
            cuda_visible_devices=None,
            threads=0,
        )
    )
    assert p[2].pinning.cpus == [0, 1, 2, 3, 5] and p[2].pinning.mempolicy == ""
    assert (p[3].pinning.cpus, p[3].pinning.numa_node) == ([6, 7], 0)
    assert [x.host_policy for x in p] == ["node1", "node1", "pool", "both"]


def test_policy_named_after_the_kind_applies_by_default_and_counts_in_the_spread() -> None:
    policies = parse_host_policies(["cpu,cpu-cores=0-1"], BIG)
    usage = CoreUsage()
    cpu = plan_instances(
        config('name: "a"  instance_group [{kind: KIND_CPU}]'), BIG, policies, usage
    )
    assert cpu[0].pinning.cpus == [0, 1]
    model = plan_instances(config('name: "b" instance_group [{kind: KIND_MODEL}]'), BIG, {}, usage)
    assert model[0].pinning.cpus == [2]  # 0 and 1 already carry an instance


def test_kind_gpu_makes_count_instances_per_gpu() -> None:
    policies = parse_host_policies(["gpu_1,numa-node=1"], BIG)
    cfg = config('name: "g" instance_group [{count: 2 kind: KIND_GPU gpus: [0, 1]}]')
    plan = plan_instances(cfg, BIG, policies)
    assert [(p.name, p.device_id, p.host_policy) for p in plan] == [
        ("g_0_0", 0, "gpu_0"),
        ("g_0_0", 1, "gpu_1"),
        ("g_0_1", 0, "gpu_0"),
        ("g_0_1", 1, "gpu_1"),
    ]
    assert [p.index for p in plan] == [0, 1, 2, 3]
    assert [p.pinning.cuda_visible_devices for p in plan] == ["0", "1", "0", "1"]
    assert plan[1].pinning.mempolicy == "bind" and plan[1].pinning.numa_node == 1
    assert len(plan[0].pinning.cpus) == 1  # gpu_0 has no policy: one spread core


def test_kind_gpu_without_gpus_uses_all_and_follows_the_brokers_visible_devices() -> None:
    topo = dataclasses.replace(BIG, gpus=("2", "3"))  # broker ran with CUDA_VISIBLE_DEVICES=2,3
    plan = plan_instances(config('name: "g" instance_group [{kind: KIND_GPU}]'), topo)
    assert [(p.device_id, p.pinning.cuda_visible_devices) for p in plan] == [(0, "2"), (1, "3")]


def test_kind_auto_resolves_like_triton() -> None:
    auto = config('name: "a" instance_group [{kind: KIND_AUTO}]')
    assert {p.kind for p in plan_instances(auto, BIG)} == {"GPU"}
    assert plan_instances(auto, BIG, backend_gpu=False)[0].kind == "CPU"
    no_gpus = dataclasses.replace(BIG, gpus=())
    assert plan_instances(auto, no_gpus)[0].kind == "CPU"
    missing = config('name: "a" instance_group [{kind: KIND_AUTO gpus: [0, 5]}]')
    (cpu,) = plan_instances(missing, BIG)
    assert (cpu.kind, cpu.device_id, cpu.pinning.cuda_visible_devices) == ("CPU", 0, None)


def groups_of(text: str, gpus: range) -> list[tuple[str, str, int, list[int]]]:
    """(name, kind, count, gpus) of each group ``text``'s config gets."""
    cfg = config(text)
    complete_groups(cfg, gpus)
    kind = model_config_pb2.ModelInstanceGroup.Kind.Name
    return [(g.name, kind(g.kind), g.count, list(g.gpus)) for g in cfg.instance_group]


@pytest.mark.parametrize(
    ("text", "gpus", "want"),
    [  # Triton's core (model_config_utils.cc) and its backends' preferred groups
        ('name: "o" backend: "onnxruntime"', range(0), [("o", "KIND_CPU", 2, [])]),
        ('name: "o" backend: "onnxruntime"', range(2), [("o", "KIND_GPU", 1, [0, 1])]),
        ('name: "t" backend: "pytorch"', range(0), [("t", "KIND_CPU", 1, [])]),
        ('name: "v" backend: "openvino"', range(2), [("v", "KIND_CPU", 1, [])]),
        ('name: "p" backend: "python"', range(0), [("p", "KIND_CPU", 1, [])]),
        ('name: "p" backend: "python"', range(1), [("p", "KIND_GPU", 1, [0])]),
        (
            'name: "i" backend: "identity" instance_group [{count: 3}, {name: "g" gpus: [0, 5]}]',
            range(2),
            [("i_0", "KIND_GPU", 3, [0, 1]), ("g", "KIND_CPU", 1, [])],
        ),
        (
            'name: "o" backend: "onnxruntime" instance_group [{kind: KIND_CPU}, {kind: KIND_GPU}]',
            range(1),
            [("o_0", "KIND_CPU", 2, []), ("o_1", "KIND_GPU", 1, [0])],
        ),
    ],
)
def test_groups_are_completed_as_tritons_core_completes_them(
    text: str, gpus: range, want: list[tuple[str, str, int, list[int]]]
) -> None:
    assert groups_of(text, gpus) == want


def test_pin_none_leaves_everything_alone_but_still_validates() -> None:
    policies = parse_host_policies(["p,numa-node=1"], BIG)
    cfg = config(
        'name: "m" instance_group [{count: 2 kind: KIND_CPU host_policy: "p"}, {kind: KIND_GPU}]'
    )
    plan = plan_instances(cfg, BIG, policies, pin=False)
    assert [p.kind for p in plan] == ["CPU", "CPU", "GPU", "GPU"]
    assert [p.pinning for p in plan] == [PinningSpec()] * 4
    bad = config('name: "m" instance_group [{host_policy: "nope"}]')
    invalid(plan_instances, bad, BIG, policies, pin=False)


def test_model_thread_parameter_sizes_threads() -> None:
    cfg = config('name: "t" parameters {key: "INTRA_OP_THREAD_COUNT" value: {string_value: "3"}}')
    assert plan_instances(cfg, BIG)[0].pinning.threads == 3


@pytest.mark.parametrize(
    "groups, needles",
    [
        ('{host_policy: "nope"}', ["host_policy 'nope'", "--host-policy=nope,", "defined: p"]),
        ("{kind: KIND_GPU gpus: [0, 4]}", ["gpu 4 does not exist", "valid gpus: 0-1"]),
        ("{count: -2}", ["count is -2"]),
        ("{kind: KIND_CPU gpus: [0]}", ["KIND_CPU but lists gpus [0]"]),
    ],
)
def test_bad_instance_groups_name_model_and_group(groups: str, needles: list[str]) -> None:
    policies = parse_host_policies(["p,numa-node=0"], BIG)
    message = invalid(plan_instances, config(f'name: "m" instance_group [{groups}]'), BIG, policies)
    assert message.startswith("model 'm' instance group 'm_0': ")
    for needle in needles:
        assert needle in message


def test_kind_gpu_on_a_machine_without_gpus() -> None:
    no_gpus = dataclasses.replace(BIG, gpus=())
    cfg = config('name: "m" instance_group [{name: "gg" kind: KIND_GPU}]')
    message = invalid(plan_instances, cfg, no_gpus)
    assert message == (
        "model 'm' instance group 'gg': has kind KIND_GPU but this machine has no GPUs; "
        "use KIND_CPU"
    )


def test_slots_continue_from_slot_start() -> None:
    plan = plan_instances(config('name: "m" instance_group [{count: 3}]'), CPUS16, slot_start=10)
    assert [p.slot for p in plan] == [10, 11, 12]
