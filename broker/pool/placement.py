"""Where each model instance runs: host policies and the instance plan.

The broker decides placement; the worker only applies it (``workers/pinning.py``), so
every decision here ends as plain data: one :class:`Placement` per worker process, with the
``InstanceSpec`` and ``PinningSpec`` of its worker spec (``wire.worker.spec``).  Nothing
here imports ``workers`` or torch (``broker/pool/topology.py`` reads the machine).

Semantics follow Triton (model_config_utils.cc, backend_model_instance.cc):

* ``--host-policy=NAME,numa-node=N`` / ``--host-policy=NAME,cpu-cores=0-3,5``; repeated
  flags for one NAME merge, the last value of a key wins.
* An instance uses the policy its group names, else the default name of its kind:
  ``cpu``, ``gpu_<device>`` or ``model`` (so ``--host-policy=gpu_1,numa-node=1`` places every
  instance on GPU 1 by the GPU's NUMA node, as in Triton).
* The groups are completed first as Triton's core completes them (names, kinds, counts,
  GPUs: ``pool.instance_groups``); instance ``c`` of a group is ``<group>_<c>``; KIND_GPU
  makes ``count`` instances per listed GPU.

Unlike Triton, instances without a host policy are not left floating: each gets one core,
the least used of the broker's cores, counted over every model the broker serves
(:class:`CoreUsage`), so instances spread round-robin over the machine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferpool.broker.pool.instance_groups import complete_groups
from inferpool.broker.pool.topology import Topology, format_cpu_list, parse_cpu_list
from inferpool.wire.errors import invalid_arg
from inferpool.wire.worker.spec import InstanceSpec, PinningSpec

__all__ = [
    "CoreUsage",
    "HostPolicy",
    "Placement",
    "Planner",
    "Topology",
    "parse_host_policies",
    "parse_host_policy",
    "plan_instances",
]

HOST_POLICY_KEYS = ("numa-node", "cpu-cores")
KINDS = {0: "AUTO", 1: "GPU", 2: "CPU", 3: "MODEL"}  # ModelInstanceGroup.Kind, without KIND_
SECONDARY_KINDS = {0: "KIND_NVDLA"}
THREADS_PARAMETER = "INTRA_OP_THREAD_COUNT"  # Triton's pytorch backend parameter


@dataclass(frozen=True)
class HostPolicy:
    """One ``--host-policy`` NAME with its validated settings."""

    name: str
    numa_node: int | None = None
    cpu_cores: tuple[int, ...] = ()


def _split_flag(text: str) -> tuple[str, dict[str, str]]:
    """``NAME,KEY=VALUE[,KEY=VALUE...]`` -> (name, settings); a bare item continues the value
    before it, so ``p,cpu-cores=0-3,5,numa-node=0`` reads as cores ``0-3,5`` and node 0."""
    flag = f"--host-policy={text}"
    name, _, rest = text.partition(",")
    name = name.strip()
    if not name or "=" in name or not rest.strip():
        raise invalid_arg(
            f"{flag}: expected NAME,KEY=VALUE, e.g. --host-policy=gpu_0,numa-node=0 or "
            f"--host-policy=pool,cpu-cores=0-3,5 (keys: {', '.join(HOST_POLICY_KEYS)})"
        )
    settings: dict[str, str] = {}
    key = ""
    for item in rest.split(","):
        if "=" in item:
            key, _, value = item.partition("=")
            key = key.strip()
            settings[key] = value.strip()
        elif key:
            settings[key] += "," + item.strip()
        else:
            raise invalid_arg(f"{flag}: '{item}' is not KEY=VALUE")
    return name, settings


def _make_policy(name: str, settings: Mapping[str, str], flag: str, topo: Topology) -> HostPolicy:
    numa_node: int | None = None
    cores: tuple[int, ...] = ()
    for key, value in settings.items():
        if key == "numa-node":
            if not value.isdigit() or int(value) not in topo.nodes:
                raise invalid_arg(
                    f"{flag}: numa-node '{value}' is not a NUMA node of this machine; "
                    f"valid: {', '.join(map(str, topo.nodes))}"
                )
            numa_node = int(value)
        elif key == "cpu-cores":
            try:
                cores = tuple(parse_cpu_list(value))
            except ValueError as exc:
                raise invalid_arg(
                    f"{flag}: cpu-cores '{value}': {exc}; expected cores and ranges like 0-3,5"
                ) from None
            if not cores:
                raise invalid_arg(f"{flag}: cpu-cores is empty; give cores like 0-3,5")
            missing = [c for c in cores if c not in topo.cpus]
            if missing:
                raise invalid_arg(
                    f"{flag}: cpu-cores '{value}' names core(s) {format_cpu_list(missing)} "
                    f"that this machine does not have or this broker may not use; "
                    f"valid cores: {format_cpu_list(topo.cpus)}"
                )
        else:
            raise invalid_arg(
                f"{flag}: unknown key '{key}'; valid keys: {', '.join(HOST_POLICY_KEYS)}"
            )
    return HostPolicy(name, numa_node, cores)


def parse_host_policy(text: str, topology: Topology | None = None) -> HostPolicy:
    """Parse and validate one ``--host-policy`` value against this machine (or ``topology``)."""
    name, settings = _split_flag(text)
    topo = topology or Topology.discover()
    return _make_policy(name, settings, f"--host-policy={text}", topo)


def parse_host_policies(
    texts: Iterable[str], topology: Topology | None = None
) -> dict[str, HostPolicy]:
    """Parse every ``--host-policy`` flag, merging repeated NAMEs (the last value wins)."""
    topo = topology or Topology.discover()
    merged: dict[str, dict[str, str]] = {}
    for text in texts:
        name, settings = _split_flag(text)
        _make_policy(name, settings, f"--host-policy={text}", topo)  # errors name this flag
        merged.setdefault(name, {}).update(settings)
    return {n: _make_policy(n, s, f"--host-policy={n}", topo) for n, s in merged.items()}


@dataclass
class CoreUsage:
    """How many instances each core carries, over every model this broker serves.

    One per broker: the planner takes the least-used core for each unpinned-by-policy
    instance and counts policy instances on their cores, so models spread over the machine;
    ``release`` gives the cores back when a model unloads.
    """

    counts: dict[int, int] = field(default_factory=dict)

    def take(self, allowed: Sequence[int]) -> int:
        core = min(allowed, key=lambda c: (self.counts.get(c, 0), c))
        self.counts[core] = self.counts.get(core, 0) + 1
        return core

    def add(self, cpus: Iterable[int]) -> None:
        for c in cpus:
            self.counts[c] = self.counts.get(c, 0) + 1

    def release(self, placements: Iterable[Placement]) -> None:
        for p in placements:
            for c in p.pinning.cpus:
                if self.counts.get(c, 0) > 0:
                    self.counts[c] -= 1


@dataclass(frozen=True)
class Placement:
    """One model instance, i.e. one worker process, and where it runs."""

    model: str
    name: str  # Triton's instance name, <group>_<c> (shared by a group's GPUs, as in Triton)
    group: str
    kind: str  # "CPU", "GPU" or "MODEL"
    device_id: int
    index: int  # within the model, over all groups
    slot: int  # slot_start + index: the supervisor's worker slot
    host_policy: str
    passive: bool
    secondary_devices: list[dict[str, Any]]
    pinning: PinningSpec

    def instance(self) -> InstanceSpec:
        """The instance part of the worker spec."""
        return InstanceSpec(
            name=self.name,
            kind=self.kind,
            device_id=self.device_id,
            index=self.index,
            host_policy=self.host_policy,
            passive=self.passive,
            secondary_devices=[dict(d) for d in self.secondary_devices],
        )


def _threads_parameter(config: Any) -> int:
    value = ""
    if THREADS_PARAMETER in config.parameters:
        value = config.parameters[THREADS_PARAMETER].string_value.strip()
    return int(value) if value.isdigit() else 0


def _pinning(
    kind: str, gpu: int, policy: HostPolicy | None, topo: Topology, usage: CoreUsage, threads: int
) -> PinningSpec:
    visible = topo.gpus[gpu] if kind == "GPU" else None
    numa_node, mempolicy, cpus = None, "", []
    if policy is not None and (policy.numa_node is not None or policy.cpu_cores):
        if policy.numa_node is not None:
            numa_node, mempolicy = policy.numa_node, "bind"
            cpus = list(topo.nodes[policy.numa_node])
        if policy.cpu_cores:  # cpu-cores narrows (or, with numa-node, overrides) affinity
            cpus = list(policy.cpu_cores)
        usage.add(cpus)
    elif topo.cpus:
        cpus = [usage.take(topo.cpus)]
    return PinningSpec(cpus, numa_node, mempolicy, visible, threads)


def _resolve_group(
    group: Any, where: str, topo: Topology, policies: Mapping[str, HostPolicy]
) -> tuple[str, list[int]]:
    """Triton's validation of one completed group: (kind, devices)."""
    gpu_ids = set(range(len(topo.gpus)))
    gpus = list(group.gpus)
    kind = KINDS.get(group.kind)
    if kind is None or kind == "AUTO":
        raise invalid_arg(
            f"{where}: unknown kind {group.kind}; valid: KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL"
        )
    if group.count < 1:
        raise invalid_arg(
            f"{where}: count is {group.count}; it must be 1 or more (0 or unset: the default)"
        )
    if kind == "CPU" and gpus:
        raise invalid_arg(f"{where}: has kind KIND_CPU but lists gpus {gpus}; drop them")
    if kind == "GPU":
        if not gpu_ids:
            raise invalid_arg(
                f"{where}: has kind KIND_GPU but this machine has no GPUs; use KIND_CPU"
            )
        bad = [g for g in gpus if g not in gpu_ids]
        if bad:
            raise invalid_arg(
                f"{where}: gpu {bad[0]} does not exist on this machine; "
                f"valid gpus: {format_cpu_list(gpu_ids)}"
            )
    if group.host_policy and group.host_policy not in policies:
        raise invalid_arg(
            f"{where}: host_policy '{group.host_policy}' was not defined with "
            f"--host-policy={group.host_policy},KEY=VALUE "
            f"(defined: {', '.join(sorted(policies)) or 'none'})"
        )
    return kind, gpus if kind == "GPU" else [0]


def plan_instances(
    config: Any,
    topology: Topology,
    policies: Mapping[str, HostPolicy] | None = None,
    usage: CoreUsage | None = None,
    *,
    pin: bool = True,
    backend_gpu: bool = True,
    slot_start: int = 0,
) -> list[Placement]:
    """Expand a ``ModelConfig``'s instance groups into one :class:`Placement` per instance.

    ``usage`` is the broker-wide :class:`CoreUsage` (a fresh one plans this model alone);
    ``backend_gpu`` says whether the backend can run on GPUs (KIND_AUTO falls back to CPU
    when it cannot); ``pin=False`` leaves every pinning empty (policies are still checked).
    Raises INVALID_ARG naming the model and the group for a config this machine cannot run.
    """
    policies = policies or {}
    usage = usage if usage is not None else CoreUsage()
    if config.HasField("ensemble_scheduling"):
        return []  # an ensemble runs in the broker, it has no instances
    model, threads = config.name, _threads_parameter(config)
    cfg = type(config)()
    cfg.CopyFrom(config)
    complete_groups(cfg, range(len(topology.gpus)) if backend_gpu else ())
    placements: list[Placement] = []
    for group in cfg.instance_group:
        gname = group.name
        where = f"model '{model}' instance group '{gname}'"
        kind, devices = _resolve_group(group, where, topology, policies)
        count = group.count
        secondary = [
            {"kind": SECONDARY_KINDS.get(d.kind, str(d.kind)), "device_id": int(d.device_id)}
            for d in group.secondary_devices
        ]
        for c in range(count):
            for device in devices:
                default = {"CPU": "cpu", "GPU": f"gpu_{device}", "MODEL": "model"}[kind]
                pname = group.host_policy or default
                policy = policies.get(pname)
                pinning = (
                    _pinning(kind, device, policy, topology, usage, threads)
                    if pin
                    else PinningSpec()
                )
                index = len(placements)
                placements.append(
                    Placement(
                        model=model,
                        name=f"{gname}_{c}",
                        group=gname,
                        kind=kind,
                        device_id=device,
                        index=index,
                        slot=slot_start + index,
                        host_policy=pname,
                        passive=bool(group.passive),
                        secondary_devices=secondary,
                        pinning=pinning,
                    )
                )
    return placements


class Planner:
    """Plans every model this broker serves on one machine, with its host policies, counting
    cores over all of them (one per broker)."""

    def __init__(self, topology: Topology, policies: Mapping[str, HostPolicy], pin: bool) -> None:
        self.topology = topology
        self.policies = policies
        self.pin = pin
        self._usage = CoreUsage()

    def complete(self, config: Any) -> None:
        """Complete ``config``'s instance groups for this machine (``pool.instance_groups``)."""
        complete_groups(config, range(len(self.topology.gpus)))

    def plan(self, config: Any) -> list[Placement]:
        """:func:`plan_instances` for one model; its cores count until :meth:`release`."""
        return plan_instances(config, self.topology, self.policies, self._usage, pin=self.pin)

    def release(self, placements: Iterable[Placement]) -> None:
        self._usage.release(placements)
