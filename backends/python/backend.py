"""The python backend: serves a Triton python model (``<version>/model.py``).

Triton runs model.py in a stub process beside the server and ships tensors to it through its
own shared memory; an inferpool worker already is a separate process whose inputs view
shared memory, so model.py runs right here.  The lifecycle maps as in Triton: the model
level imports model.py and runs ``auto_complete_config``; each instance creates its own
``TritonPythonModel`` and calls ``initialize(args)``, ``execute(requests)``, ``finalize()``.

As in Triton, inputs reach the model in host memory (``as_numpy()`` works) unless the config
sets ``FORCE_CPU_ONLY_INPUT_TENSORS`` to ``"no"``: then an input in a client's CUDA region
stays on the GPU (``is_cpu()`` is False; ``to_dlpack()`` hands it over without a copy).
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import sys
from typing import Any

from inferpool.backends.api import (
    Backend,
    Model,
    ModelInstance,
    Request,
    Response,
    answer_returned,
    batch_size_of,
    now_ns,
)
from inferpool.backends.python import bls, pb_utils
from inferpool.backends.python.autocomplete import ModelConfig, dict_to_config
from inferpool.backends.python.pb_types import (
    InferenceRequest,
    InferenceResponse,
    TritonError,
    to_api_response,
)
from inferpool.backends.python.telemetry import calling
from inferpool.wire.config_json import config_to_dict
from inferpool.wire.errors import Code, InferpoolError, internal, invalid_arg, not_found

UTILS_MODULE = "triton_python_backend_utils"
MODEL_CLASS = "TritonPythonModel"
CPU_ONLY_PARAMETER = "FORCE_CPU_ONLY_INPUT_TENSORS"


def load_model_class(path: str) -> type:
    """Import model.py as Triton's stub does and return its ``TritonPythonModel`` class.

    ``import triton_python_backend_utils`` resolves to
    :mod:`inferpool.backends.python.pb_utils`, and the version and model directories are
    appended to ``sys.path`` (as Triton does) so that modules beside model.py import.
    """
    sys.modules[UTILS_MODULE] = pb_utils
    version_dir = os.path.dirname(os.path.abspath(path))
    for directory in (version_dir, os.path.dirname(version_dir)):
        if directory not in sys.path:
            sys.path.append(directory)
    name = f"_inferpool_python_model_{abs(hash(os.path.abspath(path))):x}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise invalid_arg(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise InferpoolError.wrap(exc, Code.INVALID_ARG, f"importing {path} failed: ") from exc
    cls = getattr(module, MODEL_CLASS, None)
    if not isinstance(cls, type):
        raise invalid_arg(f"{path} defines no class {MODEL_CLASS}; the python backend serves it")
    if not callable(getattr(cls, "execute", None)):
        raise invalid_arg(f"{MODEL_CLASS} in {path} has no execute(self, requests) method")
    return cls


class PythonModel(Model):
    """Finds and imports model.py, and lets it complete the config."""

    def initialize(self) -> None:
        self.model_file = self._model_file()
        self.model_class = load_model_class(self.model_file)
        hook = getattr(self.model_class, "auto_complete_config", None)
        if hook is not None and self.auto_complete_config:
            self._auto_complete(hook)
        self.config_json = json.dumps(config_to_dict(self.config))  # args["model_config"]
        self.supports_batching = self.max_batch_size > 0
        self.cpu_only_inputs = self._cpu_only_inputs()

    def _cpu_only_inputs(self) -> bool:
        """Triton's ``FORCE_CPU_ONLY_INPUT_TENSORS``: "yes" (the default) or "no"."""
        value = self.parameter(CPU_ONLY_PARAMETER, "yes")
        if value not in ("yes", "no"):
            raise InferpoolError(
                Code.UNSUPPORTED,
                f'Incorrect value for {CPU_ONLY_PARAMETER}: \'{value}\' ("yes" or "no")',
            )
        if value == "no":
            self.log.info(
                "Input tensors can be both in CPU and GPU. %s is off.", CPU_ONLY_PARAMETER
            )
        return value == "yes"

    def finalize(self) -> None:
        sys.modules.pop(self.model_class.__module__, None)

    def _model_file(self) -> str:
        filename = self.config.default_model_filename or "model.py"
        if not filename.endswith(".py"):
            raise invalid_arg(
                f"default_model_filename '{filename}' of model '{self.name}' must end with "
                "'.py' for the python backend"
            )
        path = os.path.join(self.artifact_path, filename)
        if not os.path.isfile(path):
            raise not_found(
                f"model '{self.name}' version {self.version} has no {path}: the python "
                f"backend loads class {MODEL_CLASS} from <model>/<version>/{filename}"
            )
        return path

    def _auto_complete(self, hook: Any) -> None:
        where = f"auto_complete_config() in {self.model_file}"
        try:
            completed = hook(ModelConfig(config_to_dict(self.config)))
            if not isinstance(completed, ModelConfig):
                raise invalid_arg(
                    f"it returned {type(completed).__name__}; return the pb_utils.ModelConfig "
                    "it was given"
                )
            self.set_config(dict_to_config(completed.as_dict()))
        except Exception as exc:
            raise InferpoolError.wrap(exc, Code.INVALID_ARG, f"{where} failed: ") from exc


class PythonInstance(ModelInstance):
    """One ``TritonPythonModel`` object: Triton's per-instance stub."""

    model: PythonModel

    def initialize(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.user = self.model.model_class()
        hook = getattr(self.user, "initialize", None)
        if hook is not None:
            self._call("initialize()", hook, self._args())
        bls.serve(True, self.model.calls)

    def _args(self) -> dict[str, str]:
        """Triton's ``initialize(args)``: every key and value a string.

        ``model_instance_device_id`` is the CUDA ordinal in this worker (0 for a KIND_GPU
        instance, whose worker sees only its GPU), so ``torch.device("cuda", int(...))``
        in a model written for Triton picks the instance's GPU.
        """
        model = self.model
        return {
            "model_config": model.config_json,
            "model_instance_kind": self.kind,
            "model_instance_name": self.name,
            "model_instance_device_id": str(self.cuda_ordinal),
            "model_repository": model.repository_path,
            "model_version": str(model.version),
            "model_name": model.name,
        }

    def _call(self, what: str, hook: Any, *args: Any) -> Any:
        try:
            with calling(self.model):
                return hook(*args)
        except TritonError as err:
            raise err.to_inferpool() from None
        except Exception as exc:
            raise InferpoolError.wrap(
                exc, Code.INTERNAL, f"{MODEL_CLASS}.{what} in {self.model.model_file} failed: "
            ) from exc

    def execute(self, requests: list[Request]) -> None:
        """Run the model's ``execute`` and send what it returns; the statistics count the
        sending (Triton's python backend takes ``exec_end`` after its ResponseSend)."""
        exec_start = now_ns()
        try:
            with calling(self.model):
                cpu_only = self.model.cpu_only_inputs
                result = self.user.execute([InferenceRequest._wrap(r, cpu_only) for r in requests])
                if inspect.isawaitable(result):  # ``async def execute``, run to completion
                    result = self._event_loop().run_until_complete(result)
        except TritonError as err:
            raise err.to_inferpool() from None
        compute_end = now_ns()
        responses = None if result is None else self._responses(requests, result)
        if responses is not None:  # sent before exec_end, as Triton's python backend does
            backend = self.model.backend.name
            for request, response in zip(requests, responses, strict=True):
                answer_returned(request, response, backend)
        exec_end = now_ns()
        for i, request in enumerate(requests):
            success = responses is None or responses[i].error is None
            self.report_statistics(request, success, exec_start, exec_start, compute_end, exec_end)
        batch = sum(batch_size_of(r, self.model.supports_batching) for r in requests)
        self.report_batch_statistics(batch, exec_start, exec_start, compute_end, exec_end)
        return None

    def _responses(self, requests: list[Request], result: Any) -> list[Response]:
        where = f"execute() in {self.model.model_file}"
        if not isinstance(result, list | tuple) or len(result) != len(requests):
            got = (
                f"{len(result)} responses"
                if isinstance(result, list | tuple)
                else (f"a {type(result).__name__}")
            )
            raise internal(
                f"{where} returned {got} for {len(requests)} requests; return a list with one "
                "pb_utils.InferenceResponse per request, or None after answering every "
                "request through get_response_sender()"
            )
        return [
            to_api_response(request, response)
            if isinstance(response, InferenceResponse)
            else Response(
                request,
                internal(
                    f"{where} returned {type(response).__name__} for request '{request.id}' "
                    "instead of a pb_utils.InferenceResponse"
                ),
            )
            for request, response in zip(requests, result, strict=True)
        ]

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def finalize(self) -> None:
        bls.serve(False)
        try:
            hook = getattr(self.user, "finalize", None)
            if hook is not None:
                self._call("finalize()", hook)
        finally:
            if self._loop is not None:
                self._loop.close()


class PythonBackend(Backend):
    """The python backend: a user's model.py run as Triton's python backend runs it."""

    model_class = PythonModel
    instance_class = PythonInstance
    parallel_instance_loading = True


BACKEND = PythonBackend
