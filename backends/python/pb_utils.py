"""inferpool's ``triton_python_backend_utils``: what ``import ... as pb_utils`` gives model.py.

The python backend registers this module under the name ``triton_python_backend_utils``
before it imports model.py, so a Triton python model runs unchanged as far as the names
below go (BLS included: ``InferenceRequest(...).exec()``, docs/pipelines.md).
docs/backends.md lists what Triton has that this module does not (model loading, request
rescheduling, ...).
"""

from __future__ import annotations

from typing import Any

from inferpool.backends.python.autocomplete import ModelConfig
from inferpool.backends.python.pb_types import (
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponse,
    InferenceResponseSender,
    InferenceTrace,
    TritonError,
)
from inferpool.backends.python.telemetry import Logger, LogLevel, MetricFamily
from inferpool.backends.python.tensor import (
    Tensor,
    TritonModelException,
    numpy_to_triton_type,
    triton_string_to_numpy,
    triton_to_numpy_type,
)


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    """The request's input ``name``, or None if the request has no such input."""
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    """The response's output ``name``, or None if it has none."""
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _tensor_config(model_config: dict[str, Any], kind: str, name: str) -> dict[str, Any] | None:
    for tensor in model_config.get(kind, []):
        if tensor.get("name") == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry of input ``name`` (from ``json.loads(args["model_config"])``)."""
    return _tensor_config(model_config, "input", name)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The config entry of output ``name`` (from ``json.loads(args["model_config"])``)."""
    return _tensor_config(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """Whether a model config (as ``args['model_config']`` parses) is decoupled."""
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


__all__ = [
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "LogLevel",
    "Logger",
    "MetricFamily",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "numpy_to_triton_type",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "using_decoupled_model_transaction_policy",
]
