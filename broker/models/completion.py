"""Serving the config a backend completed (Triton's auto-complete).

A backend may complete its model's config in ``Model.initialize`` (``Model.set_config``; the
python backend's ``auto_complete_config``): add inputs and outputs, set ``max_batch_size``,
dynamic batching or the decoupled policy.  Every worker reports the config it serves in its
"ready" message.  The first report of a version is checked (Triton's rules, as for a
config.pbtxt) and becomes what the broker serves: metadata, config and admission all use it.
Every later report of that version, from another instance or a restarted one, must be the
same config, or the version is refused: one model cannot have two I/O contracts.
"""

from __future__ import annotations

import os
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.config import CONFIG_FILE, validate
from inferpool.broker.models.core_defaults import add_core_defaults
from inferpool.broker.models.registry import ModelVersion
from inferpool.wire.errors import Code, InferpoolError

# Acted upon before any worker starts (placement, versions, which backend): not completable.
FIXED_FIELDS = ("name", "backend", "platform", "version_policy", "instance_group")


def adopt(mv: ModelVersion, reported: Any, instance: str) -> bool:
    """Check the config ``instance`` reported for ``mv``; True if it now serves a new one.

    Raises INVALID_ARG naming the model, the instance and the problem.
    """
    config = _parse(mv, reported, instance)
    add_core_defaults(config)  # for what the backend added (dynamic batching, ...)
    if mv.completed_by:
        if config != mv.config:
            raise InferpoolError(
                Code.INVALID_ARG,
                f"instances '{mv.completed_by}' and '{instance}' of model {mv.label} completed "
                "the configuration differently (they differ in "
                f"{', '.join(_differences(mv.config, config))}); "
                "every instance must complete it the same way: make auto_complete_config / "
                "Model.set_config depend only on the model, or write the result in config.pbtxt",
            )
        return False
    changed = [f for f in FIXED_FIELDS if f in _differences(mv.repository_config, config)]
    if changed:
        raise InferpoolError(
            Code.INVALID_ARG,
            f"instance '{instance}' of model {mv.label} changed {', '.join(changed)} while "
            f"completing the configuration; {', '.join(FIXED_FIELDS)} are fixed before the "
            "model loads: set them in config.pbtxt",
        )
    where = f"{os.path.join(mv.path, CONFIG_FILE)} as completed by backend '{config.backend}'"
    validate(config, mv.name, where)
    mv.completed_by = instance
    if config == mv.config:
        return False
    mv.use_config(config)
    return True


def _parse(mv: ModelVersion, reported: Any, instance: str) -> pb.ModelConfig:
    if reported is None:  # nothing reported: the backend serves the config it was given
        return mv.repository_config
    try:
        return json_format.ParseDict(reported, pb.ModelConfig())
    except (json_format.ParseError, TypeError, AttributeError) as exc:
        raise InferpoolError(
            Code.INTERNAL,
            f"instance '{instance}' of model {mv.label} reported an unreadable configuration: "
            f"{exc}",
        ) from None


def _differences(a: pb.ModelConfig, b: pb.ModelConfig) -> list[str]:
    """The top-level fields in which two configs differ."""
    return [
        f.name for f in pb.ModelConfig.DESCRIPTOR.fields if getattr(a, f.name) != getattr(b, f.name)
    ]
