"""What of a model configuration inferpool implements: the rest is named, never ignored silently.

A config.pbtxt may set any field of Triton's ModelConfig.  At load every set field is
checked against :data:`HONORED` (the fields the broker, the worker and every built-in
backend implement; a field listed honours all of its sub-fields, a field with honoured
sub-fields is looked into).  Any other set field is named in a warning: the model loads
and the field has no effect.  Some fields work only with a server flag (the response cache,
the rate limiter): without it they are named in a warning too, with the flag to give.  A
few combinations cannot work and fail the load, with Triton's words.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from inferpool.wire.errors import InferpoolError, invalid_arg

log = logging.getLogger("inferpool.config")

HONORED = frozenset(
    {
        "name",
        "platform",
        "backend",
        "version_policy",
        "max_batch_size",
        "input.name",
        "input.data_type",
        "input.dims",
        "input.reshape",
        "input.optional",
        "input.allow_ragged_batch",
        "output.name",
        "output.data_type",
        "output.dims",
        "output.reshape",
        "output.label_filename",
        "batch_input",
        "batch_output",
        "dynamic_batching.preferred_batch_size",
        "dynamic_batching.max_queue_delay_microseconds",
        "dynamic_batching.priority_levels",
        "dynamic_batching.default_priority_level",
        "dynamic_batching.default_queue_policy",
        "dynamic_batching.priority_queue_policy",
        "sequence_batching.direct",
        "sequence_batching.oldest.max_candidate_sequences",
        "sequence_batching.oldest.preferred_batch_size",
        "sequence_batching.oldest.max_queue_delay_microseconds",
        "sequence_batching.max_sequence_idle_microseconds",
        "sequence_batching.control_input",
        "sequence_batching.state.input_name",
        "sequence_batching.state.output_name",
        "sequence_batching.state.data_type",
        "sequence_batching.state.dims",
        "sequence_batching.state.initial_state",
        "instance_group.name",
        "instance_group.kind",
        "instance_group.count",
        "instance_group.gpus",
        "instance_group.secondary_devices",
        "instance_group.passive",
        "instance_group.host_policy",
        "default_model_filename",
        "parameters",
        "model_warmup",
        "model_transaction_policy",
        "ensemble_scheduling.step.model_name",
        "ensemble_scheduling.step.model_version",
        "ensemble_scheduling.step.input_map",
        "ensemble_scheduling.step.output_map",
    }
)
# fields that work only with a server flag: the flag that makes them work
NEEDS_FLAG = {
    "response_cache": "the server has no response cache; start it with --cache-size",
    "instance_group.rate_limiter": (
        "the server runs without a rate limiter; start it with --rate-limit execution_count"
    ),
}
_LOOK_INSIDE = frozenset(  # every field above an honoured sub-field
    p.rsplit(".", depth)[0]
    for p in HONORED | set(NEEDS_FLAG)
    for depth in range(1, p.count(".") + 1)
)


@dataclass(frozen=True)
class ConfigSupport:
    """Which config fields this server implements, given its flags."""

    cache: bool = False  # --cache-size > 0
    rate_limit: bool = False  # --rate-limit execution_count

    def check(self, config: Any) -> InferpoolError | None:
        """Log a warning for every set field this server does not implement; the error
        that refuses the model, if one does."""
        name = config.name
        for path in unimplemented(config):
            if path in NEEDS_FLAG:
                if (path == "response_cache" and self.cache) or (
                    path == "instance_group.rate_limiter" and self.rate_limit
                ):
                    continue
                log.warning(
                    "model '%s': config field '%s' is ignored: %s", name, path, NEEDS_FLAG[path]
                )
            else:
                log.warning(
                    "model '%s': config field '%s' is not implemented by inferpool and is ignored",
                    name,
                    path,
                )
        return _triton_refusals(config)


def unimplemented(message: Any, prefix: str = "") -> list[str]:
    """Paths of the fields set in ``message`` that are not in HONORED, in field order."""
    found: list[str] = []
    for field, value in message.ListFields():
        path = prefix + field.name
        if path in HONORED:
            continue
        if path in _LOOK_INSIDE:
            for item in value if field.is_repeated else [value]:
                found += [p for p in unimplemented(item, path + ".") if p not in found]
        elif path not in found:
            found.append(path)
    return found


def _triton_refusals(config: Any) -> InferpoolError | None:
    """Triton's load errors for a response cache it cannot keep."""
    if not config.response_cache.enable:
        return None
    name = config.name
    if config.HasField("sequence_batching"):
        return invalid_arg(
            f"Response Cache does not currently support model {name} with sequence batching "
            "scheduler. Please disable the response cache."
        )
    if config.model_transaction_policy.decoupled:
        return decoupled_cache_refusal(name)
    return None


def decoupled_cache_refusal(name: str) -> InferpoolError:
    """Triton's error for a response cache on a model that streams (an ensemble does when
    one of its steps does)."""
    return invalid_arg(
        f"Response Cache does not currently support model {name} with 'decoupled' "
        "transaction policy. Please disable the response cache."
    )
