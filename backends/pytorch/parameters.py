"""The model parameters of the seed's ``ParseParameters`` and how they take effect.

Thread counts are set once at model load (a worker hosts one model), for the process; OpenMP
and MKL keep theirs per thread, so a thread that runs executions besides the one that loaded
the model (a lane's) takes the count at its first (the host's ``backends.threads``).  The
JIT, cuDNN and inference-mode switches are global; the seed sets them before every
execution, and so does :meth:`Settings.applied`, which also puts the previous values back
so that nothing leaks into other code sharing the process (tests, the harness).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from inferpool.backends.api import Model
from inferpool.backends.config_parameters import bool_parameter, int_parameter

# read for every execution (bound once: no lookups in torch._C each time)
_get_optimize = torch._C._get_graph_executor_optimize
_get_cudnn = torch._C._get_cudnn_enabled
_InferenceMode = torch._C._InferenceMode


@dataclass(frozen=True)
class Settings:
    """Parsed parameters; ``None`` for a JIT switch means "leave torch's default alone"."""

    optimized_execution: bool = True
    inference_mode: bool = True
    cudnn: bool = True
    cache_cleaning: bool = False
    weight_sharing: bool = False
    tensor_fuser: bool | None = None
    jit_profiling: bool | None = None
    jit_executor: bool | None = None
    intra_op_threads: int = 0
    inter_op_threads: int = 0

    @classmethod
    def parse(cls, model: Model) -> Settings:
        """Read every parameter; a malformed value is INVALID_ARG naming the key."""

        def flag(key: str, default: bool, invert: bool = False) -> bool:
            value = bool_parameter(model, key)
            return default if value is None else value != invert

        return cls(
            optimized_execution=flag("DISABLE_OPTIMIZED_EXECUTION", True, invert=True),
            inference_mode=flag("INFERENCE_MODE", True),
            cudnn=flag("DISABLE_CUDNN", True, invert=True),
            cache_cleaning=flag("ENABLE_CACHE_CLEANING", False),
            weight_sharing=flag("ENABLE_WEIGHT_SHARING", False),
            tensor_fuser=bool_parameter(model, "ENABLE_TENSOR_FUSER"),
            jit_profiling=bool_parameter(model, "ENABLE_JIT_PROFILING"),
            jit_executor=bool_parameter(model, "ENABLE_JIT_EXECUTOR"),
            intra_op_threads=int_parameter(model, "INTRA_OP_THREAD_COUNT") or 0,
            inter_op_threads=int_parameter(model, "INTER_OP_THREAD_COUNT") or 0,
        )

    def log_to(self, log: logging.Logger, model_name: str) -> None:
        def state(on: bool) -> str:
            return "enabled" if on else "disabled"

        log.info(
            "Optimized execution is %s for model '%s'", state(self.optimized_execution), model_name
        )
        log.info("Cache Cleaning is %s for model '%s'", state(self.cache_cleaning), model_name)
        log.info("Inference Mode is %s for model '%s'", state(self.inference_mode), model_name)
        log.info("cuDNN is %s for model '%s'", state(self.cudnn), model_name)
        log.info("Weight sharing is %s for model '%s'", state(self.weight_sharing), model_name)
        for what, value in (
            ("Tensor fuser", self.tensor_fuser),
            ("Jit profiling", self.jit_profiling),
            ("Jit executor", self.jit_executor),
        ):
            if value is not None:
                log.info("%s is %s for model '%s'", what, state(value), model_name)

    def apply_threads(self, log: logging.Logger, model_name: str) -> None:
        """Set torch's intra/inter-op thread pools (only positive counts change anything)."""
        if self.intra_op_threads > 0:
            torch.set_num_threads(self.intra_op_threads)
            log.info(
                "Intra op thread count is set to %d for model '%s'",
                self.intra_op_threads,
                model_name,
            )
        if self.inter_op_threads > 0:
            try:
                torch.set_num_interop_threads(self.inter_op_threads)
            except RuntimeError as exc:  # torch allows it once, before any inter-op work
                log.warning("INTER_OP_THREAD_COUNT not applied for model '%s': %s", model_name, exc)
            else:
                log.info(
                    "Inter op thread count is set to %d for model '%s'",
                    self.inter_op_threads,
                    model_name,
                )

    def applied(self) -> contextlib.AbstractContextManager[Any]:
        """Run an execution under these settings (inference mode or no-grad, JIT switches);
        the process-wide switches are set (and set back) only where they differ.  Where none
        differs (the usual case) this is only the grad mode's guard: no generator, no flags
        read twice."""
        if (
            self.jit_switches
            or _get_optimize() != self.optimized_execution
            or _get_cudnn() != self.cudnn
        ):
            return self._swapped()
        return _InferenceMode(True) if self.inference_mode else torch.no_grad()

    @contextlib.contextmanager
    def _swapped(self) -> Iterator[None]:
        c = torch._C
        optimize = c._get_graph_executor_optimize()
        cudnn = c._get_cudnn_enabled()
        swap = optimize != self.optimized_execution or cudnn != self.cudnn
        if swap:
            c._set_graph_executor_optimize(self.optimized_execution)
            c._set_cudnn_enabled(self.cudnn)
        jit = self.jit_switches and _swap_jit(
            self.jit_profiling, self.jit_executor, self.tensor_fuser
        )
        try:
            with torch.inference_mode() if self.inference_mode else torch.no_grad():
                yield
        finally:
            if jit:
                _swap_jit(*jit)
            if swap:
                c._set_cudnn_enabled(cudnn)
                c._set_graph_executor_optimize(optimize)

    @functools.cached_property
    def jit_switches(self) -> bool:
        """Whether the model sets any JIT switch (most leave them all as torch has them)."""
        switches = (self.jit_profiling, self.jit_executor, self.tensor_fuser)
        return any(v is not None for v in switches)


def _swap_jit(
    profiling: bool | None, executor: bool | None, fuser: bool | None
) -> tuple[bool | None, bool | None, bool | None]:
    """Set the JIT switches that are not None; return what they were (None where untouched)."""
    c = torch._C
    old_profiling = None if profiling is None else c._jit_set_profiling_mode(profiling)
    old_executor = None if executor is None else c._jit_set_profiling_executor(executor)
    old_fuser = None
    if fuser is not None:
        old_fuser = c._jit_texpr_fuser_enabled()
        c._jit_set_texpr_fuser_enabled(fuser)
    return old_profiling, old_executor, old_fuser
