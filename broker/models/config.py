"""Model configuration: config.pbtxt parsed with Triton's real schema, completed and checked.

Only what the broker itself relies on is validated here (names, datatypes, dims, batching,
backend resolution); backend-specific rules belong to the backend's Model.initialize().
Every error names the model, the file and what to do about it.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.ensemble_config import check_platform, is_ensemble, wiring
from inferpool.wire import codec
from inferpool.wire.config_json import config_to_dict
from inferpool.wire.errors import Code, InferpoolError

CONFIG_FILE = "config.pbtxt"

# Triton platforms whose backend is implied by the platform name, and back.
PLATFORM_BACKENDS = {"pytorch_libtorch": "pytorch", "onnxruntime_onnx": "onnxruntime"}
BACKEND_PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "pytorch": "pytorch_libtorch"}
# A version directory's model file (or directory: model.onnx may be one) -> the config a
# model without config.pbtxt (or a config override without a backend) starts from, as
# Triton infers it; a libtriton_<B>.so in a version directory or the model directory
# implies backend B.
MODEL_FILES = {
    "model.py": {"backend": "python"},
    "model.pt": {"platform": "pytorch_libtorch"},
    "model.onnx": {"backend": "onnxruntime"},
    "model.xml": {"backend": "openvino"},
}
_C_BACKEND = re.compile(r"libtriton_(\w+)\.so")
# The model file Triton's core writes into the config of these backends when it names none
# (default_model_filename, as the model's config reports it); pytorch's only where the
# platform was implied too, as in Triton.
DEFAULT_MODEL_FILENAMES = {
    "onnxruntime": "model.onnx",
    "openvino": "model.xml",
    "python": "model.py",
    "pytorch": "model.pt",
}


def config_error(model: str, path: str, problem: str, fix: str = "") -> InferpoolError:
    """INVALID_ARG naming the model, its config file, the problem and the fix."""
    text = f"model '{model}' ({path}): {problem}"
    return InferpoolError(Code.INVALID_ARG, f"{text}. {fix}" if fix else text)


def load_config(model_dir: str, auto_complete: bool = True) -> pb.ModelConfig:
    """Parse, complete and validate ``<model_dir>/config.pbtxt``; without ``auto_complete``
    (``--disable-auto-complete-config``) the file must exist, as in Triton."""
    model = os.path.basename(os.path.normpath(model_dir))
    path = os.path.join(model_dir, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if not auto_complete:
            raise InferpoolError(
                Code.INTERNAL,
                f"failed to open text file for read {path}: No such file or directory (the "
                "server runs with --disable-auto-complete-config: every model needs its "
                "config.pbtxt, with every setting its backend needs)",
            ) from None
        config = _inferred(model_dir, model)
        if config is None:
            raise InferpoolError(
                Code.INVALID_ARG,
                f"model '{model}' has no configuration: {path} does not exist. Create it with "
                f'at least name: "{model}" and a backend (for example backend: "identity"), or '
                "give it a <version>/model.py, which the python backend serves",
            ) from None
        complete(config, model, path, model_dir)
        validate(config, model, path)
        return config
    except OSError as exc:
        raise config_error(model, path, f"cannot read it ({exc.strerror})") from None
    try:
        config = text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise config_error(
            model,
            path,
            f"not a valid model configuration: {exc}",
            "The file uses Triton's protobuf text format (model_config.proto)",
        ) from None
    complete(config, model, path, model_dir)
    validate(config, model, path)
    return config


def _inferred(model_dir: str, model: str) -> pb.ModelConfig | None:
    """A model without config.pbtxt, as Triton serves one: the backend is the one its
    version directories' model file implies (``model.py``: python, ``model.pt``: pytorch),
    and the backend completes the rest (the python backend's ``auto_complete_config``)."""
    fields = _implied(model_dir, "")
    return None if fields is None else pb.ModelConfig(name=model, **fields)


def _implied(model_dir: str, filename: str) -> dict[str, str] | None:
    """The backend (or platform) a model's file implies, as Triton's core infers it: the
    ``default_model_filename`` where the config names one, else the first known model file
    in a version directory, else a ``libtriton_<B>.so`` there or in the model directory."""
    if filename:
        return MODEL_FILES.get(filename)
    try:
        versions = [e for e in os.listdir(model_dir) if e.isdigit() and int(e) > 0]
    except OSError:
        return None
    for name, fields in MODEL_FILES.items():
        if any(os.path.exists(os.path.join(model_dir, v, name)) for v in versions):
            return fields
    for where in [*(os.path.join(model_dir, v) for v in sorted(versions)), model_dir]:
        with contextlib.suppress(OSError):
            for entry in sorted(os.listdir(where)):
                match = _C_BACKEND.fullmatch(entry)
                if match:
                    return {"backend": match.group(1)}
    return None


def complete(config: pb.ModelConfig, model: str, path: str, model_dir: str) -> None:
    """Fill the defaults Triton fills from the model's directory: name, the backend from the
    platform or from the model's files in ``model_dir``, the model file's name, version
    policy (the rest is ``models.core_defaults``' and ``pool.instance_groups``').
    ``path`` names the config in errors (its file, or "config override")."""
    if not config.name:
        config.name = model
    elif config.name != model:
        raise config_error(
            model,
            path,
            f"the configuration names the model '{config.name}' but its directory is '{model}'",
            "Make name match the directory name",
        )
    problem = check_platform(config)
    if problem:
        raise config_error(model, path, problem)
    ensemble = is_ensemble(config)  # runs in the broker: no backend, no instances
    if not config.backend and not config.platform and not ensemble:
        fields = _implied(model_dir, config.default_model_filename) or {}
        config.backend = fields.get("backend", "")
        config.platform = fields.get("platform", "")
    if not config.backend and not ensemble:
        implied = PLATFORM_BACKENDS.get(config.platform)
        if implied is None:
            raise config_error(
                model,
                path,
                f"Could not determine backend for model '{model}' with no backend in model "
                "configuration",
                'Add a backend line to config.pbtxt, for example backend: "identity" (or '
                'backend: "python" with a model.py, or platform: "pytorch_libtorch", or '
                'platform: "ensemble" with ensemble_scheduling)',
            )
        config.backend = implied
    implied_platform = not config.platform and config.backend in BACKEND_PLATFORMS
    if implied_platform:
        config.platform = BACKEND_PLATFORMS[config.backend]
    if (
        not config.default_model_filename
        and config.backend in DEFAULT_MODEL_FILENAMES
        and (implied_platform or config.backend != "pytorch")
    ):
        config.default_model_filename = DEFAULT_MODEL_FILENAMES[config.backend]
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1


def validate(config: pb.ModelConfig, model: str, path: str) -> None:
    """Check a completed config; INVALID_ARG naming what is wrong."""
    if config.max_batch_size < 0:
        raise config_error(model, path, f"max_batch_size must be >= 0, got {config.max_batch_size}")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: set[str] = set()
        for t in tensors:
            if not t.name:
                raise config_error(model, path, f"an {kind} has no name")
            if t.name in seen:
                raise config_error(model, path, f"{kind} '{t.name}' is declared twice")
            seen.add(t.name)
            if t.data_type == pb.TYPE_INVALID:
                raise config_error(model, path, f"{kind} '{t.name}' has no data_type")
            datatype = codec.config_to_wire_datatype(pb.DataType.Name(t.data_type))
            if datatype not in codec.DATATYPES:
                raise config_error(
                    model,
                    path,
                    f"{kind} '{t.name}' has unsupported data_type {pb.DataType.Name(t.data_type)}",
                )
            if any(d < -1 or d == 0 for d in t.dims):
                raise config_error(
                    model,
                    path,
                    f"{kind} '{t.name}' has invalid dims {list(t.dims)}: each must be -1 or > 0",
                )
            if t.HasField("reshape") and _fixed_elements(t.reshape.shape) != _fixed_elements(
                t.dims
            ):
                raise config_error(
                    model,
                    path,
                    f"{kind} '{t.name}' reshape {list(t.reshape.shape)} does not hold the same "
                    f"number of elements as dims {list(t.dims)}",
                )
    dyn = config.dynamic_batching
    if config.HasField("dynamic_batching"):
        for size in dyn.preferred_batch_size:
            if config.max_batch_size and size > config.max_batch_size:
                raise config_error(
                    model,
                    path,
                    f"dynamic_batching preferred_batch_size {size} exceeds max_batch_size "
                    f"{config.max_batch_size}",
                )
        _validate_priorities(dyn, model, path)
    if config.HasField("sequence_batching"):
        _validate_sequence_strategy(config, model, path)
    _validate_batch_io(config, model, path)
    for group in config.instance_group:
        if group.count < 0:
            raise config_error(
                model,
                path,
                f"instance_group '{group.name}' has count {group.count}; need >= 1 (or none: "
                "the default)",
            )
    if is_ensemble(config):
        try:
            wiring(config)
        except InferpoolError as err:
            raise config_error(model, path, err.message) from None


def _validate_priorities(dyn: Any, model: str, path: str) -> None:
    """Triton's checks of priority levels and their queue policies (Triton's wording)."""
    levels = dyn.priority_levels
    if not levels:
        return
    if not 1 <= dyn.default_priority_level <= levels:
        raise config_error(
            model, path, f"default priority level must be in range [1, {levels}] for {model}"
        )
    for level in dyn.priority_queue_policy:
        if not 1 <= level <= levels:
            raise config_error(
                model,
                path,
                f"priority queue policy must have priority level in range [1, {levels}] for "
                f"{model} (got {level})",
            )


def _validate_batch_io(config: Any, model: str, path: str) -> None:
    """Triton's checks of ``batch_input`` and ``batch_output`` (its words)."""
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}

    def fail(problem: str) -> InferpoolError:
        return config_error(model, path, f"{problem} for {model}")

    for batch_in in config.batch_input:
        kind = pb.BatchInput.Kind.Name(batch_in.kind)
        if len(batch_in.source_input) != 1:
            raise fail(
                f"batch input kind '{kind}' expects 1 source input, got "
                f"{len(batch_in.source_input)}"
            )
        if batch_in.data_type not in (pb.TYPE_INT32, pb.TYPE_FP32):
            raise fail("batch input data type must be TYPE_INT32 or TYPE_FP32")
        for source in batch_in.source_input:
            if source not in inputs:
                raise fail(f"unknown source input name '{source}'")
    for batch_out in config.batch_output:
        kind = pb.BatchOutput.Kind.Name(batch_out.kind)
        if len(batch_out.source_input) != 1:
            raise fail(
                f"batch output kind '{kind}' expects 1 source input, got "
                f"{len(batch_out.source_input)}"
            )
        for source in batch_out.source_input:
            if source not in inputs:
                raise fail(f"unknown source input name '{source}'")
        targets: set[str] = set()
        for target in batch_out.target_name:
            if target not in outputs:
                raise fail(f"unknown target output name '{target}'")
            if target in targets:
                raise fail(f"target output name '{target}' can only be specified once")
            targets.add(target)


def _validate_sequence_strategy(config: Any, model: str, path: str) -> None:
    """Triton's checks of the oldest and direct sequence-batching strategies."""
    seq = config.sequence_batching
    if seq.HasField("oldest"):
        for size in seq.oldest.preferred_batch_size:
            if size <= 0 or size > config.max_batch_size:
                raise config_error(
                    model,
                    path,
                    "sequence batching preferred batch size must be positive and <= max batch "
                    f"size for {model} (got {size}, max_batch_size {config.max_batch_size})",
                )
    if seq.HasField("direct") and not 0.0 <= seq.direct.minimum_slot_utilization <= 1.0:
        raise config_error(
            model,
            path,
            f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {model}",
        )


def _fixed_elements(dims: Any) -> int | None:
    """Element count of a shape, or None when it has variable dimensions."""
    n = 1
    for d in dims:
        if d < 0:
            return None
        n *= d
    return n


def wire_datatype(data_type: int) -> str:
    """The protocol's datatype of a config data type (``TYPE_FP32`` -> ``FP32``)."""
    return codec.config_to_wire_datatype(pb.DataType.Name(data_type))


def to_json(config: pb.ModelConfig) -> str:
    """The config as protobuf JSON (what workers start from)."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)


def to_dict(config: pb.ModelConfig) -> dict[str, Any]:
    """The config as ``model_config`` serves it (every frontend): Triton's JSON form."""
    return config_to_dict(config)
