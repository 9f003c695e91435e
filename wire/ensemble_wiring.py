"""An ensemble's wiring as both its runners read it, and the rules they run it by.

Two parts run an ensemble's steps: the broker (``broker.models.ensemble``) and a
shared-memory client over lanes (``client.ensemble_run``).  Both hold the same
:class:`Wiring`: the steps, the tensors each reads and writes, which steps read each tensor
and which step writes it.  The broker builds it from the configuration
(``broker.models.ensemble_config``) and sends its steps in an ``open_lane`` answer
(:meth:`Wiring.entries`); the client reads it back (:meth:`Wiring.from_entries`).

The rules both apply: a step starts once every tensor it reads exists (:meth:`Step.ready`);
a tensor passed between a side that batches and one that does not gains or loses a batch
dimension of one (:func:`batch_reshape`); a failing step fails the request, named
(:func:`step_failed`), and a request whose outputs cannot all be made is Triton's deadlock
(:func:`ensemble_deadlock`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from inferpool.wire.contract import TensorSpec
from inferpool.wire.errors import InferpoolError, invalid_arg


@dataclass(frozen=True)
class Step:
    """One step of an ensemble: the model it runs and how its tensors map onto the ensemble's."""

    index: int
    model_name: str
    model_version: int  # -1: the highest ready version
    inputs: Mapping[str, str]  # model input -> ensemble tensor
    outputs: Mapping[str, str]  # model output -> ensemble tensor

    @cached_property
    def reads(self) -> tuple[str, ...]:
        """The ensemble tensors the step reads, each once."""
        return tuple(dict.fromkeys(self.inputs.values()))

    def ready(self, exists: Callable[[str], bool]) -> bool:
        """Whether the step can start: every tensor it reads ``exists``."""
        return all(exists(tensor) for tensor in self.reads)


@dataclass(frozen=True)
class Wiring:
    """An ensemble's steps, its own inputs and outputs, and who reads and writes each tensor."""

    name: str
    steps: tuple[Step, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    readers: Mapping[str, tuple[int, ...]] = field(init=False)  # tensor -> steps reading it
    writer: Mapping[str, int] = field(init=False)  # tensor -> the step writing it

    def __post_init__(self) -> None:
        readers: dict[str, list[int]] = {}
        writer: dict[str, int] = {}
        for step in self.steps:
            for tensor in step.reads:
                readers.setdefault(tensor, []).append(step.index)
            for tensor in step.outputs.values():
                writer.setdefault(tensor, step.index)
        object.__setattr__(self, "readers", {t: tuple(r) for t, r in readers.items()})
        object.__setattr__(self, "writer", writer)

    def models(self) -> list[str]:
        """The models the steps run, each once, sorted."""
        return sorted({step.model_name for step in self.steps})

    def last_writer(self) -> int:
        """The last step that writes one of the ensemble's outputs."""
        return max(self.writer[tensor] for tensor in self.outputs if tensor in self.writer)

    def entries(self) -> list[dict[str, Any]]:
        """The steps as an ``open_lane`` answer lists them (PROTOCOL.md)."""
        return [
            {
                "model_name": step.model_name,
                "model_version": step.model_version,
                "input_map": dict(step.inputs),
                "output_map": dict(step.outputs),
            }
            for step in self.steps
        ]

    @classmethod
    def from_entries(
        cls,
        name: str,
        entries: Sequence[Mapping[str, Any]],
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> Wiring:
        """The wiring an ``open_lane`` answer lists (``entries``: its steps)."""
        steps = tuple(
            Step(
                i,
                entry["model_name"],
                int(entry["model_version"]),
                dict(entry["input_map"]),
                dict(entry["output_map"]),
            )
            for i, entry in enumerate(entries)
        )
        return cls(name, steps, tuple(inputs), tuple(outputs))


def batch_reshape(
    spec: TensorSpec, batching: bool, batched: bool, shape: Sequence[int]
) -> Sequence[int]:
    """A tensor of ``shape`` (``batched``: made by a side that batches) as ``spec``'s model
    reads it (``batching``: it batches): the batch dimension of one added or removed where
    one side batches and the other does not (Triton's ReshapeTensorDims in an ensemble)."""
    if batching and not batched and spec.matches(tuple(shape)):
        return (1, *shape)
    if not batching and batched and not spec.matches(tuple(shape)) and shape and shape[0] == 1:
        return shape[1:]
    return shape


def step_failed(ensemble: str, index: int, model: str, err: InferpoolError) -> InferpoolError:
    """An ensemble request's error when its step ``index`` (of ``model``) failed with ``err``."""
    return InferpoolError(
        err.code,
        f"in ensemble '{ensemble}', step {index} (model '{model}') failed: {err.message}",
    )


def ensemble_deadlock(ensemble: str) -> InferpoolError:
    """Triton's words for an ensemble request that cannot make all its outputs."""
    return invalid_arg(
        f"in ensemble '{ensemble}', unexpected deadlock, at least one output is not set while "
        "no more ensemble steps can be made"
    )
