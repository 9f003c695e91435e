"""Instance placement (interim): one worker per instance, spread one core each."""

from __future__ import annotations

import os
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from broker.options import ServerOptions


def plan_instances(config: pb.ModelConfig, options: ServerOptions, existing: Any) -> list[dict[str, Any]]:
    cores = sorted(os.sched_getaffinity(0))
    used = len(existing)
    plans = []
    index = 0
    for g, group in enumerate(config.instance_group):
        kind = "GPU" if group.kind == pb.ModelInstanceGroup.KIND_GPU else "CPU"
        gname = group.name or f"{config.name}_{g}"
        for i in range(group.count):
            cpus = [cores[(used + index) % len(cores)]] if options.pin else []
            plans.append({
                "instance": {"name": f"{gname}_{i}", "kind": kind, "device_id": 0, "index": index,
                             "host_policy": group.host_policy, "passive": group.passive},
                "pinning": {"cpus": cpus},
            })
            index += 1
    return plans
