"""``inferpool infer``'s inputs: ``--input NAME=V1,V2,...`` (or ``NAME=@file.npy``) with
``--datatype`` and ``--shape``, read against the model's configuration into arrays.

Every value that cannot become the tensor the user meant is a :class:`UsageError` naming the
flag, the value and what would do, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferpool.usage import UsageError, key_value
from inferpool.wire import codec

_TRUE = ("true", "1")
_FALSE = ("false", "0")


def read_inputs(
    texts: Sequence[str],
    datatypes: Sequence[str],
    shapes: Sequence[str],
    config: dict[str, Any],
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays and wire datatypes of every ``--input``, by name."""
    model = str(config.get("name", ""))
    per_input_datatype = _per_input("--datatype", datatypes, len(texts))
    per_input_shape = _per_input("--shape", shapes, len(texts))
    arrays: dict[str, np.ndarray] = {}
    wire_types: dict[str, str] = {}
    for text, datatype, shape in zip(texts, per_input_datatype, per_input_shape, strict=True):
        name, values = key_value(text, "--input", "NAME=V1,V2,... or NAME=@file.npy")
        if name in arrays:
            raise UsageError(f"--input {name} is given twice")
        datatype = _datatype(name, datatype, model, config)
        arr = _load(values[1:], name, datatype) if values.startswith("@") else None
        if arr is None:
            arr = _values(name, values, datatype)
        if shape is not None:
            arr = _reshape(arr, shape, name)
        elif not values.startswith("@") and int(config.get("max_batch_size", 0)) > 0:
            arr = arr.reshape(1, -1)  # one row of a batching model's batch
        arrays[name] = arr
        wire_types[name] = datatype
    return arrays, wire_types


def _per_input(flag: str, given: Sequence[str], inputs: int) -> list[str | None]:
    """One value of ``flag`` for each input: as given in order, or the only one for all."""
    if len(given) > inputs:
        raise UsageError(f"{len(given)} {flag} values for {inputs} --input(s): give one per input")
    if len(given) == 1:
        return [given[0]] * inputs
    return [*given, *([None] * (inputs - len(given)))]


def _datatype(name: str, given: str | None, model: str, config: dict[str, Any]) -> str:
    if given is not None:
        datatype = codec.config_to_wire_datatype(given.strip().upper())
        if datatype not in codec.DATATYPES:
            known = ", ".join(sorted(codec.DATATYPES))
            raise UsageError(f"--datatype {given!r} is not a datatype; one of {known}")
        return datatype
    declared = config.get("input", [])
    spec = next((i for i in declared if i.get("name") == name), None)
    if spec is None:
        names = ", ".join(str(i.get("name")) for i in declared) or "none"
        raise UsageError(
            f"model '{model}' has no input '{name}' (its inputs: {names}); "
            "give --datatype to send it anyway"
        )
    return codec.config_to_wire_datatype(str(spec.get("data_type", "TYPE_FP32")))


def _values(name: str, text: str, datatype: str) -> np.ndarray:
    items = text.split(",") if text else []
    if datatype == "BYTES":
        return np.array([v.encode() for v in items], dtype=object)
    dtype = codec.numpy_dtype(datatype)
    parsed = [_element(v.strip(), datatype, name) for v in items]
    try:
        return np.array(parsed, dtype=dtype)
    except (OverflowError, ValueError) as exc:
        raise UsageError(f"--input {name}: a value does not fit {datatype} ({exc})") from None


def _element(text: str, datatype: str, name: str) -> Any:
    try:
        if datatype == "BOOL":
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise ValueError(text)
        if datatype.startswith(("INT", "UINT")):
            return int(text, 0)
        return float(text)
    except ValueError:
        kind = {"BOOL": "true or false", "INT": "an integer", "UINT": "an integer"}.get(
            datatype.rstrip("0123456789"), "a number"
        )
        raise UsageError(
            f"--input {name}: {text!r} is not {kind} (the input is {datatype})"
        ) from None


def _load(path: str, name: str, datatype: str) -> np.ndarray:
    where = f"--input {name}=@{path}"
    try:
        loaded = np.load(path, allow_pickle=False)
    except OSError as exc:
        raise UsageError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UsageError(f"{where}: not a .npy array numpy can read ({exc})") from None
    if not isinstance(loaded, np.ndarray):
        raise UsageError(f"{where}: holds several arrays; save one with np.save")
    if datatype == "BYTES" or codec.datatype_of(loaded.dtype) == datatype:
        return loaded
    try:
        return loaded.astype(codec.numpy_dtype(datatype), casting="same_kind")
    except TypeError:
        raise UsageError(f"{where}: its {loaded.dtype} values cannot become {datatype}") from None


def _reshape(arr: np.ndarray, text: str, name: str) -> np.ndarray:
    try:
        dims = [int(d) for d in text.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise UsageError(
            f"--shape {text!r} is not a shape: expected dims like 2x3 or 2,3"
        ) from None
    if any(d < 0 for d in dims):
        raise UsageError(f"--shape {text!r}: dims must be 0 or more")
    size = int(np.prod(dims)) if dims else 1
    if size != arr.size:
        raise UsageError(f"--shape {text} holds {size} value(s) but --input {name} gave {arr.size}")
    return arr.reshape(dims)
