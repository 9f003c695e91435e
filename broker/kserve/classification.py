"""Triton's classification extension, for both KServe frontends.

An output requested with ``classification: N`` (HTTP: a JSON number; gRPC: an
``int64_param``) is answered as BYTES instead of its own datatype: per batch element (a
model with ``max_batch_size`` above 0 batches its first dimension) the N highest values,
highest first, each as ``"<value>:<index>"``, or ``"<value>:<index>:<label>"`` when the
output's ``label_filename`` gives that class a label.  The shape is ``[batch, N]`` (``[N]``
for a model that does not batch), N at most the number of classes.  Values are written as
C's ``%f`` writes floats and integers in decimal; only numeric datatypes (not FP16, BF16,
BOOL or BYTES) can be classified.  Labels come from the broker (``model_labels``) once per
load of a model version: each request asks whether the ones held are still current.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferpool.broker.kserve.broker_channel import BrokerChannel
from inferpool.wire import codec
from inferpool.wire.errors import invalid_arg

EXTENSION = "classification"  # the name servers list in their metadata
PARAMETER = "classification"
MAX_ELEMENTS = 1_000_000  # classes per batch element, as Triton bounds them
_CLASSIFIABLE = frozenset(
    ("UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64")
)
_SHM = "shared_memory_region"
_KNOWN_MAX = 1024  # model versions whose labels are held


# ============================================================================ requests
def http_count(params: Mapping[str, Any]) -> int:
    """The classes an HTTP output's ``parameters`` ask for (0: none, its own tensor)."""
    if PARAMETER not in params:
        return 0
    if _SHM in params:
        raise invalid_arg("Output can't set both 'shared_memory_region' and 'classification'")
    count = params[PARAMETER]
    if type(count) is not int or count < 0:
        raise invalid_arg(
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer"
        )
    return count


def grpc_count(params: Any) -> int:
    """The classes a gRPC output's ``parameters`` (its protobuf map) ask for (0: none)."""
    if PARAMETER not in params:
        return 0
    param = params[PARAMETER]
    if param.WhichOneof("parameter_choice") != "int64_param":
        raise invalid_arg("invalid value type for 'classification' parameter, expected int64_param")
    if param.int64_param <= 0:
        raise invalid_arg("invalid value for 'classification' parameter, expected >= 0")
    if _SHM in params:
        raise invalid_arg("output can't set both 'shared_memory_region' and 'classification'")
    return int(param.int64_param)


# ============================================================================ labels
@dataclass(frozen=True)
class ModelClasses:
    """What classifying a model version's outputs needs: whether it batches, its labels."""

    batched: bool
    labels: Mapping[str, Sequence[str]]  # output -> label by class index
    serial: int  # the broker's name for these labels


class Labels:
    """The labels of the model versions the frontends classified outputs of."""

    def __init__(self, channel: BrokerChannel) -> None:
        self._channel = channel
        self._known: dict[tuple[str, str], ModelClasses] = {}

    async def of(self, caller: bytes, model: str, version: str) -> ModelClasses:
        """Those of ``model`` ``version`` (as a request names it), asked for ``caller``."""
        key = (model, version)
        known = self._known.get(key)
        header: dict[str, Any] = {
            "type": "model_labels",
            "model_name": model,
            "model_version": version,
        }
        if known is not None:
            header["serial"] = known.serial
        reply, _ = await self._channel.call(caller, header)
        labels = reply["labels"] if "labels" in reply or known is None else known.labels
        found = ModelClasses(reply["max_batch_size"] > 0, labels, reply["serial"])
        if found != known:
            if len(self._known) >= _KNOWN_MAX:
                self._known.clear()
            self._known[key] = found
        return found

    async def apply(
        self, caller: bytes, reply: dict[str, Any], tensors: list[Any], counts: Mapping[str, int]
    ) -> list[Any]:
        """:func:`classify` with the labels of the model version that answered ``reply``."""
        if not counts:
            return tensors
        model = await self.of(caller, reply["model_name"], reply["model_version"])
        return classify(reply, tensors, counts, model)


# ============================================================================ answers
def classify(
    reply: dict[str, Any], tensors: list[Any], counts: Mapping[str, int], model: ModelClasses
) -> list[Any]:
    """The tensors of ``reply`` (those not in a region, in order), each output ``counts``
    names replaced by its classes; its datatype and shape in ``reply`` become theirs."""
    found = list(tensors)
    at = 0
    for out in reply.get("outputs", ()):
        if codec.in_shared_memory(out):
            continue
        count = counts.get(out["name"], 0)
        if count:
            out["shape"], found[at] = top_classes(
                found[at], out["datatype"], out["shape"], count, model, out["name"]
            )
            out["datatype"] = "BYTES"
        at += 1
    return found


def top_classes(
    buf: Any, datatype: str, shape: list[int], count: int, model: ModelClasses, name: str
) -> tuple[list[int], bytes]:
    """The shape and serialized BYTES of output ``name``'s top ``count`` classes."""
    if datatype not in _CLASSIFIABLE:
        raise invalid_arg(
            f"class result not available for output due to unsupported type '{datatype}'"
        )
    values = codec.array_from_buffer(buf, datatype, shape, f"output '{name}'")
    batched = model.batched and len(shape) > 0
    rows = shape[0] if batched else 1
    per_row = math.prod(shape[1:] if batched else shape)
    if per_row > MAX_ELEMENTS:
        raise invalid_arg("classification output tensor too large")
    kept = min(count, per_row)
    labels = model.labels.get(name, ())
    entries: list[str] = []
    for row in values.reshape(rows, per_row):
        entries += _entries(row, kept, labels)
    return ([rows, kept] if batched else [kept]), codec.serialize_bytes(entries)


def _entries(row: np.ndarray, kept: int, labels: Sequence[str]) -> list[str]:
    """The ``kept`` highest values of ``row`` as ``value:index[:label]``, highest first
    (equal values by index; NaN ranks as -inf)."""
    keys = np.where(np.isnan(row), -np.inf, row) if row.dtype.kind == "f" else row
    chosen = np.arange(len(row))
    if kept < len(row):  # the kept highest, without sorting them all
        least = np.partition(keys, len(row) - kept)[len(row) - kept]
        above = np.flatnonzero(keys > least)
        chosen = np.concatenate((above, np.flatnonzero(keys == least)[: kept - len(above)]))
    order = chosen[np.lexsort((-chosen, keys[chosen]))[::-1]]
    text = "%f" if row.dtype.kind == "f" else "%d"
    entries = []
    for index, value in zip(order.tolist(), row[order].tolist(), strict=True):
        label = labels[index] if index < len(labels) else ""
        entry = f"{text % value}:{index}"
        entries.append(f"{entry}:{label}" if label else entry)
    return entries
