"""The model config as model.py sees it: Triton's JSON form (wire.config_json) and
``pb_utils.ModelConfig``.

``auto_complete_config`` edits that dict through :class:`ModelConfig`, and the backend turns
it back into a ``ModelConfig`` protobuf.
"""

from __future__ import annotations

import copy
from typing import Any

from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

_TENSOR_PROPERTIES = {
    "input": ("name", "data_type", "dims", "optional"),
    "output": ("name", "data_type", "dims"),
}


def dict_to_config(config: dict[str, Any]) -> Any:
    """The ``ModelConfig`` protobuf of a config dict; INVALID_ARG-style ValueError if bad."""
    try:
        return json_format.ParseDict(config, model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:
        raise ValueError(f"the completed model configuration is invalid: {exc}") from None


class ModelConfig:
    """What ``auto_complete_config`` receives and returns: the config, editable in place."""

    def __init__(self, model_config: dict[str, Any]) -> None:
        self._config = copy.deepcopy(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def _name(self) -> str:
        return str(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = int(self._config.get("max_batch_size", 0))
        if configured > max_batch_size:
            raise ValueError(
                f"model '{self._name()}': the configuration sets max_batch_size {configured}, "
                f"larger than the {max_batch_size} auto_complete_config allows"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"model '{self._name()}': the configuration uses {other}; "
                    "auto_complete_config cannot switch it to dynamic_batching"
                )
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy: dict[str, Any]) -> None:
        unknown = set(transaction_policy) - {"decoupled"}
        if unknown:
            raise ValueError(
                f"model '{self._name()}': model_transaction_policy has no {sorted(unknown)}"
            )
        policy = self._config.setdefault("model_transaction_policy", {})
        configured = policy.get("decoupled", False)
        wanted = bool(transaction_policy.get("decoupled", False))
        if configured and not wanted:
            raise ValueError(
                f"model '{self._name()}': the configuration is decoupled; "
                "auto_complete_config cannot make it non-decoupled"
            )
        policy["decoupled"] = wanted

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output)

    def _add(self, kind: str, tensor: dict[str, Any]) -> None:
        allowed = _TENSOR_PROPERTIES[kind]
        name = tensor.get("name")
        where = f"{kind} '{name}' of model '{self._name()}' in auto_complete_config"
        extra = sorted(set(tensor) - set(allowed))
        if extra:
            raise ValueError(f"{where}: unknown properties {extra}; allowed: {list(allowed)}")
        for required in ("name", "data_type", "dims"):
            if required not in tensor:
                raise ValueError(f"{where}: missing the '{required}' property")
        wanted = {**tensor, "dims": [int(d) for d in tensor["dims"]]}
        for existing in self._config.setdefault(kind, []):
            if existing.get("name") != name:
                continue
            data_type = existing.get("data_type", "TYPE_INVALID")
            if data_type not in ("TYPE_INVALID", wanted["data_type"]):
                raise ValueError(
                    f"{where}: the configuration says {data_type}, the model says "
                    f"{wanted['data_type']}"
                )
            dims = [int(d) for d in existing.get("dims", [])]
            if dims and dims != wanted["dims"]:
                raise ValueError(
                    f"{where}: the configuration says dims {dims}, the model says {wanted['dims']}"
                )
            existing.update(wanted)
            return
        self._config[kind].append(wanted)
