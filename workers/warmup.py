"""Warm-up: an instance runs its model's ``model_warmup`` samples before it reports Ready.

As Triton's model instances do (backend_model_instance.cc), each sample is a batch of
``batch_size`` requests of batch 1, built from zeros, random bytes or a file in the model's
``warmup/`` folder, executed ``count`` times (at least once) on the instance itself; samples
with ``batch_size`` 0 are skipped.  Responses are read for errors only and their outputs
given back; the first sample that fails ends the warm-up with Triton's message, "failed to
run warmup sample '<name>': <errors>; ", and the load fails with it.

It runs here, in the worker between the model's load and its Ready, rather than driven by
the broker: a sample goes straight to the instance's execute (Triton builds warm-up requests
"just before execute", past the scheduler), every instance warms itself in parallel, the
broker counts a model READY only when every instance is warm without any new message, and
the requests never reach the broker, so they cannot count in its inference statistics (the
statistics the backend reported for them are dropped here).  The broker's ``--boot-timeout``
bounds a warm-up that never ends.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.backends import tensor_data
from inferpool.backends.api import InputTensor, OutputMemory, Request, RequestedOutput, Response
from inferpool.backends.host import BackendHost
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

WARMUP_FOLDER = "warmup"
log = logging.getLogger("inferpool.worker")


@dataclass(frozen=True)
class Sample:
    """One warmup sample of the config: its inputs and how many executions."""

    name: str
    batch_size: int  # requests per execution
    count: int  # executions
    inputs: dict[str, InputTensor]  # shared by the sample's requests (read-only)


def samples(config: Any, repository_path: str) -> list[Sample]:
    """The samples of ``config.model_warmup``, their data built; INVALID_ARG naming a bad one."""
    originals = {t.name: t for t in config.input}
    batching = config.max_batch_size > 0
    folder = os.path.join(repository_path, WARMUP_FOLDER)
    out = []
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            log.info("skipping warmup sample '%s' of batch size 0", setting.name)
            continue
        inputs = {}
        for name, spec in sorted(setting.inputs.items()):
            original = originals.get(name)  # else a control or state input, as given
            datatype = codec.config_to_wire_datatype(pb.DataType.Name(spec.data_type))
            dims = [int(d) for d in spec.dims]
            if any(d < 0 for d in dims):
                raise invalid_arg(
                    "warmup setting expects all variable-size dimensions are specified for "
                    f"input '{name}'"
                )
            if original is not None:
                _check(setting.name, name, datatype, dims, original, config.name)
            shape = [1, *dims] if batching and original is not None else dims
            data = _data(spec, name, datatype, shape, folder)
            inputs[name] = tensor_data.input_tensor(name, datatype, data)
        out.append(Sample(setting.name, setting.batch_size, max(setting.count, 1), inputs))
    return out


def _data(spec: Any, name: str, datatype: str, shape: list[int], folder: str) -> Any:
    kind = spec.WhichOneof("input_data_type")
    if kind == "zero_data":
        return tensor_data.zeros(datatype, shape)
    if kind == "random_data":
        return tensor_data.random(datatype, shape)
    if kind == "input_data_file":
        return tensor_data.from_file(folder, spec.input_data_file, datatype, shape, "warmup")
    raise invalid_arg(f"warmup setting expects input '{name}' to have input_data_type set")


def _check(sample: str, name: str, datatype: str, dims: list[int], spec: Any, model: str) -> None:
    expected = codec.config_to_wire_datatype(pb.DataType.Name(spec.data_type))
    if datatype != expected:
        raise invalid_arg(
            f"warmup sample '{sample}': input '{name}' data-type is '{datatype}', but model "
            f"'{model}' expects '{expected}'"
        )
    config_dims = list(spec.dims)
    if len(dims) != len(config_dims) or any(
        c not in (-1, d) for c, d in zip(config_dims, dims, strict=True)
    ):
        raise invalid_arg(
            f"warmup sample '{sample}': input '{name}' has dims {dims}, but model '{model}' "
            f"expects {config_dims}"
        )


class _Answers:
    """Collects the final answers of one execution's requests, from any thread."""

    def __init__(self, expected: int) -> None:
        self.errors: list[str] = []
        self._left = expected
        self._lock = threading.Lock()
        self.done = threading.Event()
        if not expected:
            self.done.set()

    def emit(self, request: Request, response: Response | None, final: bool) -> None:
        with self._lock:
            if response is not None:
                if response.error is not None:
                    self.errors.append(response.error.message)
                response.discard()  # warm-up outputs are not read
            if final:
                self._left -= 1
                if not self._left:
                    self.done.set()


def run(host: BackendHost, memory: OutputMemory, all_samples: list[Sample]) -> None:
    """Execute every sample on ``host``'s instance; INVALID_ARG with Triton's message if one
    fails.  Statistics the backend reported for warm-up requests are dropped."""
    outputs = [t.name for t in host.config.output]
    try:
        for sample in all_samples:
            for iteration in range(1, sample.count + 1):
                log.info("running warmup sample '%s' (iteration %d)", sample.name, iteration)
                answers = _Answers(sample.batch_size)
                requests = [
                    Request(
                        id=f"warmup-{sample.name}",
                        inputs=dict(sample.inputs),
                        requested_outputs={n: RequestedOutput(n) for n in outputs},
                        memory=memory,
                        emit=answers.emit,
                        decoupled=host.decoupled,
                    )
                    for _ in range(sample.batch_size)
                ]
                host.execute(requests)
                answers.done.wait()  # a decoupled backend may answer from its threads
                if answers.errors:
                    raise InferpoolError(
                        Code.INVALID_ARG,
                        f"failed to run warmup sample '{sample.name}': "
                        + "".join(f"{e}; " for e in answers.errors),
                    )
    finally:
        host.stats.timings.clear()
        host.take_batches()
