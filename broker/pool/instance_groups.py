"""The instance groups Triton's core gives a model: names, kinds, counts and GPUs.

A model without ``instance_group`` gets one group named after the model, of the kind its
backend prefers (openvino: KIND_CPU; the python backend: KIND_GPU when there are GPUs).
Then every group gets what it leaves unset:

* name: ``<model>_<group index>``;
* kind: KIND_AUTO is KIND_GPU when this machine has GPUs and every GPU the group lists is
  one of them, else KIND_CPU (a KIND_CPU group keeps no GPU list: inferpool places such a
  group on the CPU rather than refusing it, as Triton would);
* count: 2 for a KIND_CPU group of the onnxruntime (or tensorflow) backend, else 1;
* gpus: every GPU for a KIND_GPU group that lists none.

The completed group is what the model's config shows and what placement expands into
instances, so the number of instances started is the one the config reports.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

# ModelInstanceGroup.Kind's numbers (its module would bring numpy into placement's imports)
KIND_AUTO, KIND_GPU, KIND_CPU = 0, 1, 2
# The kind a backend asks for when the config has no group
# (TRITONBACKEND_BackendAttributeAddPreferredInstanceGroup in Triton's backends).
PREFERRED_KINDS = {"openvino": KIND_CPU, "python": KIND_GPU}
# Backends whose KIND_CPU groups get two instances by default; every other group gets one.
TWO_CPU_INSTANCES = frozenset({"onnxruntime", "tensorflow"})


def default_count(kind: int, backend: str) -> int:
    """The instance count of a group that sets none."""
    return 2 if kind == KIND_CPU and backend in TWO_CPU_INSTANCES else 1


def complete_groups(config: Any, gpu_ids: Collection[int]) -> None:
    """Fill the unset parts of ``config``'s instance groups in place; ``gpu_ids`` are the
    GPUs this machine offers.  An ensemble has no groups and is left alone."""
    if config.HasField("ensemble_scheduling"):
        return
    if not config.instance_group:
        group = config.instance_group.add(name=config.name)
        preferred = PREFERRED_KINDS.get(config.backend)
        if preferred is not None and (preferred != KIND_GPU or gpu_ids):
            group.kind = preferred
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == KIND_AUTO:
            if gpu_ids and all(g in gpu_ids for g in group.gpus):
                group.kind = KIND_GPU
            else:
                group.kind = KIND_CPU
                del group.gpus[:]
        if group.count == 0:  # unset (a negative count is refused by validation)
            group.count = default_count(group.kind, config.backend)
        if group.kind == KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(gpu_ids))
