"""What Triton's core adds to every model's config before and after its backend completes it.

Triton normalises a config twice, as read from the repository and again once the backend
has completed it, and serves the result.  Where the config leaves them unset:

* ``dynamic_batching.preferred_batch_size`` (and the oldest sequence strategy's) is
  ``[max_batch_size]`` when ``max_batch_size`` > 0: batches form exactly as without it;
* ``sequence_batching.max_sequence_idle_microseconds`` is 1000000 (one second);
* ``optimization.input_pinned_memory`` and ``output_pinned_memory`` are enabled (not for an
  ensemble).  inferpool's tensors live in shared memory, which GPU copies use as they come:
  the flags are shown as Triton shows them and change nothing.

The version policy is ``config.complete``'s; the instance groups are
``pool.instance_groups``'.
"""

from __future__ import annotations

from typing import Any

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds


def add_core_defaults(config: Any) -> None:
    """Fill the fields above in ``config`` in place (doing it twice changes nothing)."""
    limit = int(config.max_batch_size)
    dyn = config.dynamic_batching
    if config.HasField("dynamic_batching") and limit > 0 and not dyn.preferred_batch_size:
        dyn.preferred_batch_size.append(limit)
    if config.HasField("sequence_batching"):
        seq = config.sequence_batching
        if not seq.max_sequence_idle_microseconds:
            seq.max_sequence_idle_microseconds = DEFAULT_IDLE_US
        if seq.HasField("oldest") and limit > 0 and not seq.oldest.preferred_batch_size:
            seq.oldest.preferred_batch_size.append(limit)
    if not config.HasField("ensemble_scheduling"):
        optimization = config.optimization
        if not optimization.HasField("input_pinned_memory"):
            optimization.input_pinned_memory.enable = True
        if not optimization.HasField("output_pinned_memory"):
            optimization.output_pinned_memory.enable = True
