"""The spec a new worker is started with, from what the broker knows of its slot.

The fields are ``wire.worker.spec.WorkerSpec``'s; the supervisor hands the result to the
worker with ``spec_environment``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from inferpool.broker.pool.gpu_limit import limit_for
from inferpool.broker.pool.handle import WorkerHandle
from inferpool.shm.cancel_flags import flags_region
from inferpool.wire import logs
from inferpool.wire.logs import settings_dict
from inferpool.wire.worker.spec import AUTO_COMPLETE_CONFIG, WorkerSpec

if TYPE_CHECKING:
    from inferpool.broker.pool.supervisor import SupervisorOptions


def worker_spec(
    handle: WorkerHandle[Any],
    channel_fd: int,
    run_id: str,
    options: SupervisorOptions,
    output_prefault: int,
) -> WorkerSpec:
    """The spec a worker of ``handle`` starts with."""
    model = handle.model
    backend = model.config.backend
    return WorkerSpec(
        run_id=run_id,
        broker_pid=os.getpid(),
        channel_fd=channel_fd,
        identity=handle.identity,
        model_name=model.name,
        model_version=model.version,
        backend=backend,
        config_json=model.worker_config_json(),  # each worker completes its own
        repository_path=model.path,
        artifact_path=os.path.join(model.path, str(model.version)),
        output_region=handle.output_region,
        output_prefault=output_prefault,
        instance=handle.instance,
        cancel_region=flags_region(run_id),
        pinning=handle.pinning,
        backend_directory=options.backend_directory,
        # global settings (Triton's --backend-config=<key>=<value>), then the backend's own,
        # then whether it may complete its config (Triton's core passes it as a setting)
        backend_config={
            **options.backend_config.get("", {}),
            **options.backend_config.get(backend, {}),
            AUTO_COMPLETE_CONFIG: "true" if options.auto_complete_config else "false",
        },
        gpu_load_limit=limit_for(
            options.model_load_gpu_limit, handle.instance.kind, handle.instance.device_id
        ),
        log=settings_dict(logs.current()),  # as they are now: a client may have changed them
    )
