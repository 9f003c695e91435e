"""An ONNX Runtime session as Triton's onnxruntime backend configures it.

The model file is ``<version>/model.onnx`` (or ``default_model_filename``); where that is a
directory (a model whose weights lie in external files beside it), the model is
``<that directory>/model.onnx``.  The config's parameters (string values) set the session:

* ``intra_op_thread_count``: threads within an operator; 0 (the default) means one per core
  the instance is pinned to (its worker's CPU affinity), not one per core of the machine;
* ``inter_op_thread_count``: threads across operators (parallel execution mode only);
* ``execution_mode``: 0 sequential (the default), 1 parallel;
* ``enable_mem_arena``, ``enable_mem_pattern``: ONNX Runtime's CPU memory arena and memory
  pattern (booleans);
* ``session.use_device_allocator_for_initializers`` (a session config entry) and
  ``memory.enable_memory_arena_shrinkage`` (a run option), passed on as they are;
* ``optimization { graph { level } }``: -1 basic, 1 extended, 2 none, else everything.

KIND_GPU instances run on the CUDA execution provider (``gpu_execution_accelerator``
entries named "cuda" pass their parameters as its options); every other kind on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from inferpool.backends.api import Model
from inferpool.backends.config_parameters import bool_parameter, int_parameter
from inferpool.backends.model_io import ModelTensor
from inferpool.backends.onnxruntime.element_types import config_type
from inferpool.backends.threads import pinned_cores
from inferpool.wire.errors import invalid_arg, unavailable

DEFAULT_FILENAME = "model.onnx"
_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
_ARENA_SHRINKAGE = "memory.enable_memory_arena_shrinkage"
_DEVICE_INITIALIZERS = "session.use_device_allocator_for_initializers"
_CUDA_PARAMETERS = (
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
)


def model_path(artifact_path: str, filename: str, instance: str) -> str:
    """The model file; UNAVAILABLE naming it when it is missing (Triton's words)."""
    path = os.path.join(artifact_path, filename or DEFAULT_FILENAME)
    if os.path.isdir(path):
        path = os.path.join(path, DEFAULT_FILENAME)
    if not os.path.isfile(path):
        raise unavailable(f"unable to find '{path}' for model instance '{instance}'")
    return path


@dataclass(frozen=True)
class Settings:
    """The parameters that shape a session, parsed once per model."""

    intra_op_threads: int
    inter_op_threads: int
    parallel: bool
    graph_level: str
    mem_arena: bool | None
    mem_pattern: bool | None
    device_initializers: str | None
    arena_shrinkage: str | None
    cuda_options: dict[str, str]

    @classmethod
    def parse(cls, model: Model) -> Settings:
        mode = int_parameter(model, "execution_mode") or 0
        if mode not in (0, 1):
            raise invalid_arg(
                "Invalid configuration value provided. Expected values for  execution_mode "
                f"are 0 or 1 but got {mode} ."
            )
        config = model.config
        level = "ORT_ENABLE_ALL"
        if config.HasField("optimization") and config.optimization.HasField("graph"):
            level = _LEVELS.get(config.optimization.graph.level, level)
        return cls(
            intra_op_threads=int_parameter(model, "intra_op_thread_count") or 0,
            inter_op_threads=int_parameter(model, "inter_op_thread_count") or 0,
            parallel=mode == 1,
            graph_level=level,
            mem_arena=bool_parameter(model, "enable_mem_arena"),
            mem_pattern=bool_parameter(model, "enable_mem_pattern"),
            device_initializers=model.parameter(_DEVICE_INITIALIZERS),
            arena_shrinkage=model.parameter(_ARENA_SHRINKAGE),
            cuda_options=_cuda_options(config),
        )

    def session_options(self, ort: Any) -> Any:
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, self.graph_level)
        options.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if self.parallel else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        options.intra_op_num_threads = self.intra_op_threads or pinned_cores()
        if self.inter_op_threads > 0:
            options.inter_op_num_threads = self.inter_op_threads
        if self.mem_arena is not None:
            options.enable_cpu_mem_arena = self.mem_arena
        if self.mem_pattern is not None:
            options.enable_mem_pattern = self.mem_pattern
        if self.device_initializers is not None:
            options.add_session_config_entry(_DEVICE_INITIALIZERS, self.device_initializers)
        options.log_severity_level = 3  # errors only: warnings reach the log as our own
        return options

    def run_options(self, ort: Any) -> Any:
        options = ort.RunOptions()
        if self.arena_shrinkage is not None:
            options.add_run_config_entry(_ARENA_SHRINKAGE, self.arena_shrinkage)
        return options


def _cuda_options(config: Any) -> dict[str, str]:
    """Options of the "cuda" GPU execution accelerator, and the deprecated top-level
    parameters Triton still passes to the CUDA execution provider."""
    options: dict[str, str] = {}
    for key in _CUDA_PARAMETERS:
        if key in config.parameters:
            options[key] = config.parameters[key].string_value
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    for accelerator in accelerators:
        if accelerator.name == "cuda":
            options.update(dict(accelerator.parameters))
        elif accelerator.name == "tensorrt":
            raise invalid_arg(
                f"model '{config.name}': the tensorrt execution accelerator is not available "
                "(inferpool's onnxruntime backend runs the CUDA and CPU execution providers)"
            )
    return options


def providers(ort: Any, kind: str, ordinal: int, settings: Settings, instance: str) -> list[Any]:
    """The execution providers of an instance of ``kind``: CUDA for KIND_GPU, else the CPU."""
    if kind != "GPU":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise unavailable(
            f"instance '{instance}' is KIND_GPU, but this onnxruntime build has no CUDA "
            f"execution provider (it has {', '.join(ort.get_available_providers())}): install "
            "onnxruntime-gpu in place of onnxruntime"
        )
    cuda = {"device_id": str(ordinal), **settings.cuda_options}
    return [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]


def open_session(
    ort: Any, path: str, settings: Settings, kind: str, ordinal: int, model: str, instance: str
) -> Any:
    """An inference session over ``path``; UNAVAILABLE naming the file when it cannot load."""
    chosen = providers(ort, kind, ordinal, settings, instance)
    try:
        session = ort.InferenceSession(path, settings.session_options(ort), providers=chosen)
    except Exception as exc:
        raise unavailable(f"failed to load model '{model}' from '{path}': {exc}") from None
    if kind == "GPU" and "CUDAExecutionProvider" not in session.get_providers():
        # ONNX Runtime falls back to the CPU when CUDA or cuDNN libraries are missing
        raise unavailable(
            f"instance '{instance}' is KIND_GPU, but ONNX Runtime could not start its CUDA "
            "execution provider (the CUDA and cuDNN libraries onnxruntime-gpu needs are "
            "missing or do not match it); it would run on the CPU"
        )
    return session


def tensors(args: list[Any]) -> list[ModelTensor]:
    """A session's inputs or outputs (``NodeArg``) as the config names them; a symbolic or
    unknown dimension is -1."""
    return [
        ModelTensor(
            a.name,
            config_type(a.type),
            tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (a.shape or ())),
        )
        for a in args
    ]
