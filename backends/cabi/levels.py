"""A C backend as the three levels of the Python backend API: the host loads, initializes
and executes it as it does a Python backend, and each level hands its calls to the backend
library's entry points (TRITONBACKEND_Initialize ... TRITONBACKEND_ModelInstanceExecute).

Every instance runs in its own worker process, so a worker holds one backend, one model and
one instance: TRITONBACKEND_ModelInitialize runs in each worker of the model, and what a
backend keeps as model state is that worker's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from inferpool.backends import batch_strategy
from inferpool.backends.api import Backend, Model, ModelInstance, Request
from inferpool.backends.cabi import library
from inferpool.backends.cabi.bridge import LOG_LEVELS, Bridge, error_of
from inferpool.backends.cabi.requests import RequestMaker
from inferpool.backends.python.autocomplete import dict_to_config
from inferpool.wire import logs
from inferpool.wire.config_json import config_to_dict
from inferpool.wire.errors import invalid_arg

KINDS = {"CPU": 1, "GPU": 2, "MODEL": 3}  # TRITONSERVER_InstanceGroupKind
DEFAULT_MAX_BATCH_SIZE = "4"  # Triton's --backend-config default-max-batch-size
_bridge: Bridge | None = None
T = TypeVar("T")


def bridge() -> Bridge:
    """The one bridge of this process, bound to the host on first use."""
    global _bridge
    if _bridge is None:
        _bridge = Bridge()
        host = library.host()
        _bridge.deliver = host.deliver
        host.bind(_bridge)
    return _bridge


def _check(result: tuple[int, str] | None) -> None:
    """Raise the error an entry point returned, as it is (the host names the lifecycle
    call that failed; an execute's error answers its requests as Triton answers them)."""
    if result is not None:
        raise error_of(*result)


class CBackend(Backend):
    """TRITONBACKEND_Backend over a backend library; subclassed per library path."""

    library_path: ClassVar[str] = ""
    api_version = (1, 0)  # the backend checks TRITONBACKEND_ApiVersion itself

    def initialize(self) -> None:
        self.bridge = bridge()
        self.bridge.logger = self.log
        self.bridge.stats = self.stats
        host = library.host()
        self._log_levels(logs.current())
        logs.listen(self._log_levels)  # a client may change them (the logging extension)
        self.library = library.open_library(self.name, self.library_path)
        if any(hasattr(self.library.handle, f) for f in batch_strategy.FUNCTIONS):
            batch_strategy.unsupported(f"backend '{self.name}'", self.library_path)
        self.capsule = host.new_backend(
            self.name, json.dumps({"cmdline": self._cmdline()}), os.path.dirname(self.library_path)
        )
        self._call("TRITONBACKEND_Initialize", self.capsule)
        attribute = self.library.entry("TRITONBACKEND_GetBackendAttribute")
        if attribute is not None:
            # each instance loads in its own process: parallel loading is always on
            result, _parallel = host.backend_attribute(attribute, self.capsule)
            _check(result)

    def _log_levels(self, settings: logs.LogSettings) -> None:
        """Tell the host which levels TRITONSERVER_LogIsEnabled answers true for."""
        library.host().set_log_levels(
            *(self.log.isEnabledFor(level) and settings.allows(level) for level in LOG_LEVELS)
        )

    def _cmdline(self) -> dict[str, str]:
        """TRITONBACKEND_BackendConfig's settings: --backend-config, and the global ones
        Triton adds for every backend."""
        cmdline = {
            "backend-directory": self.backend_directory,
            "auto-complete-config": "true",
            "default-max-batch-size": DEFAULT_MAX_BATCH_SIZE,
            "min-compute-capability": "6.000000",
        }
        cmdline.update(self.config)
        return cmdline

    def _call(self, entry: str, capsule: Any) -> None:
        function = self.library.entry(entry)
        if function is not None:
            _check(library.host().call(function, capsule))

    def finalize(self) -> None:
        self._call("TRITONBACKEND_Finalize", self.capsule)


class CModel(Model):
    """TRITONBACKEND_Model: the config is handed over in Triton's JSON form."""

    backend: CBackend

    def initialize(self) -> None:
        host = library.host()
        self.backend.bridge.calls = self.calls
        self.capsule = host.new_model(
            self.backend.capsule,
            self.name,
            self.version,
            self.repository_path,
            json.dumps(config_to_dict(self.config)),
            self.auto_complete_config,
            self,
        )
        self.backend._call("TRITONBACKEND_ModelInitialize", self.capsule)

    def complete_config(self, json_text: str) -> str:
        """TRITONBACKEND_ModelSetConfig: the config the backend completed; the one served."""
        try:
            completed = json.loads(json_text)
        except ValueError as exc:
            raise invalid_arg(f"the completed configuration is not JSON: {exc}") from None
        try:
            self.set_config(dict_to_config(completed))
        except ValueError as exc:
            raise invalid_arg(str(exc)) from None
        return json.dumps(config_to_dict(self.config))

    def report_memory(self, memory_type: str, device_id: int, byte_size: int) -> None:
        self.stats.report_memory_usage(memory_type, device_id, byte_size)

    def finalize(self) -> None:
        self.backend._call("TRITONBACKEND_ModelFinalize", self.capsule)


class CModelInstance(ModelInstance):
    """TRITONBACKEND_ModelInstance: executes batches through the backend library."""

    model: CModel

    def initialize(self) -> None:
        host = library.host()
        backend = self.model.backend
        # a KIND_GPU worker sees only its GPU: the backend is handed the ordinal it can use
        device = self.cuda_ordinal if self.kind == "GPU" else self.device_id
        secondary = [
            (str(d.get("kind", "")), int(d.get("device_id", 0))) for d in self.secondary_devices
        ]
        policy = json.dumps({self.host_policy: {}} if self.host_policy else {})
        self.capsule = host.new_instance(
            self.model.capsule, self.name, KINDS[self.kind], device, policy, secondary, self
        )
        self._execute = backend.library.entry_points["TRITONBACKEND_ModelInstanceExecute"]
        self._host_execute = host.execute
        self._requests = RequestMaker(self.model.config)
        # the backend may wait in C for its calls' callbacks: another thread reads for it
        calls = self.model.calls
        self._run = calls.run_blocked if calls is not None else _run
        self._run(backend._call, "TRITONBACKEND_ModelInstanceInitialize", self.capsule)

    def execute(self, requests: list[Request]) -> None:
        if self.model.decoupled:  # the backend answers when it will, from any thread
            for request in requests:
                request.response_sender()
        bridge = self.model.backend.bridge
        bridge.facts = {}
        try:  # an error: the requests are the server's again (Triton's rule), the host fails them
            result = self._run(
                self._host_execute, self._execute, self.capsule, requests, self._requests
            )
        finally:
            bridge.facts = None
        if result is not None:
            bridge.forget_states(requests)  # the state of a failed batch
            _check(result)

    def report_memory(self, memory_type: str, device_id: int, byte_size: int) -> None:
        self.report_memory_usage(memory_type, byte_size, device_id)

    def finalize(self) -> None:
        self.model.backend._call("TRITONBACKEND_ModelInstanceFinalize", self.capsule)


def _run(function: Callable[..., T], *args: Any) -> T:
    """Without a broker, nothing is read for the backend: it runs as it is."""
    return function(*args)


def backend_class(path: str) -> type[CBackend]:
    """The Backend class of the library at ``path``."""
    return type(
        "CBackend",
        (CBackend,),
        {
            "library_path": path,
            "model_class": CModel,
            "instance_class": CModelInstance,
            "__module__": __name__,
        },
    )
