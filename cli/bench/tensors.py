"""The tensors a benchmark sends: every input of the model, shaped by its configuration (or
``--shape NAME:dims``, without the batch dimension, as perf_analyzer takes it) and filled
with random values, zeros, or the arrays of a file."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from inferpool.usage import UsageError
from inferpool.wire import codec

DATA_CHOICES = ("random", "zero")


def parse_shapes(texts: Sequence[str]) -> dict[str, list[int]]:
    """``["INPUT0:4", "IMAGE:3x224x224"]`` -> dims by input name."""
    shapes: dict[str, list[int]] = {}
    for text in texts:
        name, colon, dims = text.rpartition(":")
        try:
            parsed = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            parsed = []
        if not colon or not name or not parsed or any(d < 0 for d in parsed):
            raise UsageError(f"--shape expects NAME:DIMS such as INPUT0:3x224x224, got {text!r}")
        shapes[name] = parsed
    return shapes


def build_inputs(
    config: dict[str, Any], shapes: dict[str, list[int]], data: str, batch_size: int
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """One request's inputs and their wire datatypes."""
    model = config.get("name", "")
    declared = {str(i["name"]): i for i in config.get("input", [])}
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise UsageError(f"--shape names {unknown}, not inputs of model '{model}'")
    batching = int(config.get("max_batch_size", 0)) > 0
    if batch_size != 1 and not batching:
        raise UsageError(f"model '{model}' does not batch (max_batch_size 0): use --batch-size 1")
    from_file = _load(data) if data not in DATA_CHOICES else {}
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    rng = np.random.default_rng(0)
    for name, spec in declared.items():
        if spec.get("optional") and name not in shapes and name not in from_file:
            continue
        datatype = codec.config_to_wire_datatype(str(spec.get("data_type", "TYPE_FP32")))
        datatypes[name] = datatype
        if name in from_file:
            arrays[name] = _cast(from_file[name], datatype, name)
            continue
        dims = shapes.get(name) or [int(d) for d in spec.get("dims", [])]
        if any(d < 0 for d in dims):
            raise UsageError(
                f"input '{name}' of model '{model}' has variable dims {dims}: give its shape "
                f"with --shape {name}:DIMS"
            )
        shape = [batch_size, *dims] if batching else dims
        arrays[name] = _fill(rng, datatype, shape, data)
    return arrays, datatypes


def _fill(rng: np.random.Generator, datatype: str, shape: list[int], data: str) -> np.ndarray:
    if datatype == "BYTES":
        count = int(np.prod(shape)) if shape else 1
        values = [b"0" if data == "zero" else str(rng.integers(1 << 30)).encode()] * count
        return np.array(values, dtype=object).reshape(shape)
    dtype = codec.numpy_dtype(datatype)
    if data == "zero":
        return np.zeros(shape, dtype)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    return rng.random(shape).astype(dtype)


def _load(path: str) -> dict[str, Any]:
    """``--input-data FILE``: a .npz of arrays by input name, or JSON {"NAME": [values]}."""
    if not os.path.isfile(path):
        raise UsageError(f"--input-data: {path!r} is neither random, zero nor a file")
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as npz:
                return {name: npz[name] for name in npz.files}
        with open(path, encoding="utf-8") as f:
            loaded = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--input-data {path}: cannot read it ({exc})") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"--input-data {path}: expected an object of arrays by input name")
    return loaded


def _cast(value: Any, datatype: str, name: str) -> np.ndarray:
    try:
        if datatype == "BYTES":
            return np.array(
                [v.encode() if isinstance(v, str) else v for v in np.ravel(value)], dtype=object
            ).reshape(np.shape(value))
        return np.asarray(value, dtype=codec.numpy_dtype(datatype))
    except (TypeError, ValueError, OverflowError) as exc:
        raise UsageError(f"--input-data: input '{name}' cannot be {datatype} ({exc})") from None
