"""Triton's custom batching strategies: found as Triton finds them, refused at load.

In Triton, a model that is not sequence-batched may name a library of batching functions
(``TRITONBACKEND_ModelBatchIncludeRequest``, ``ModelBatchInitialize``,
``ModelBatchFinalize``, ``ModelBatcherInitialize``, ``ModelBatcherFinalize``) in its
parameter ``TRITON_BATCH_STRATEGY_PATH``; without it, a ``batchstrategy.so`` in the version,
model or backend directory is taken.  inferpool's broker forms every batch with its own
dynamic batcher and runs no native code, so it cannot call them: a model with such a
library fails to load with one line saying so, rather than being served with batches its
strategy never saw.  A backend library that defines the functions itself is refused the
same way (backends/cabi/levels.py).
"""

from __future__ import annotations

import os

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.wire.errors import Code, InferpoolError

PATH_PARAMETER = "TRITON_BATCH_STRATEGY_PATH"
LIBRARY_NAME = "batchstrategy.so"
FUNCTIONS = (
    "TRITONBACKEND_ModelBatchIncludeRequest",
    "TRITONBACKEND_ModelBatchInitialize",
    "TRITONBACKEND_ModelBatchFinalize",
    "TRITONBACKEND_ModelBatcherInitialize",
    "TRITONBACKEND_ModelBatcherFinalize",
)


def check(
    config: pb.ModelConfig,
    backend: str,
    version_path: str,
    model_path: str,
    backend_directory: str,
) -> None:
    """Raise the load error for a model with a custom batching strategy (none: return)."""
    named = PATH_PARAMETER in config.parameters
    if config.HasField("sequence_batching"):
        if named:  # Triton's error
            raise InferpoolError(
                Code.INVALID_ARG,
                f"{PATH_PARAMETER} cannot be specified with sequence batcher, using default "
                "batching strategy",
            )
        return
    if named:
        named_path = config.parameters[PATH_PARAMETER].string_value
        if not os.path.exists(named_path):
            raise InferpoolError(Code.NOT_FOUND, f"Batching library path not found: {named_path}")
        unsupported(f"model '{config.name}'", named_path)
    places = [version_path, model_path]
    if backend_directory:
        places.append(os.path.join(backend_directory, backend))
    for place in places:
        path = os.path.join(place, LIBRARY_NAME)
        if place and os.path.isfile(path):
            unsupported(f"model '{config.name}'", path)


def unsupported(owner: str, path: str) -> None:
    """The load error for a custom batching strategy in the library at ``path`` (``owner``:
    the model or backend it came with)."""
    raise InferpoolError(
        Code.UNSUPPORTED,
        f"{owner}: the custom batching strategy in {path} is not supported by "
        "inferpool: the broker's dynamic batcher forms every batch and never calls "
        f"{', '.join(FUNCTIONS)}; serve the model without it to batch by the dynamic "
        "batcher's rules",
    )
