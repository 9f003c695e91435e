"""Loading C backends: the host library (``libtritonserver.so``) and a ``libtriton_<B>.so``.

The host is the extension ``inferpool.backends.cabi._tritonserver``, built by ``pip install``
where a C compiler exists; its shared object is named ``libtritonserver.so``, the library a
backend built against Triton's headers imports from.  It is made global (RTLD_GLOBAL) before
any backend is opened, so that a backend finds every function there whether it names the
library or not; each backend is opened as Triton opens it (RTLD_NOW | RTLD_LOCAL): a function
it imports and the host lacks fails the load, naming the function.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import os
from dataclasses import dataclass
from types import ModuleType

from inferpool.wire.errors import Code, InferpoolError

HOST_MODULE = "inferpool.backends.cabi._tritonserver"
INCLUDE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
ENTRY_POINTS = (
    "TRITONBACKEND_Initialize",
    "TRITONBACKEND_Finalize",
    "TRITONBACKEND_GetBackendAttribute",
    "TRITONBACKEND_ModelInitialize",
    "TRITONBACKEND_ModelFinalize",
    "TRITONBACKEND_ModelInstanceInitialize",
    "TRITONBACKEND_ModelInstanceFinalize",
    "TRITONBACKEND_ModelInstanceExecute",
)


def include_dir() -> str:
    """Where the project's headers of Triton's API are: ``-I`` this to build a C backend."""
    return INCLUDE_DIR


@functools.cache
def host() -> ModuleType:
    """The host library, loaded once and made global; UNAVAILABLE, in one line, where
    ``pip install`` could not build it."""
    try:
        module = importlib.import_module(HOST_MODULE)
    except ImportError as exc:
        raise InferpoolError(
            Code.UNAVAILABLE,
            "C backends need inferpool's host of Triton's C API, which was not built "
            f"({exc}); install a C compiler (apt-get install gcc), then reinstall inferpool",
        ) from None
    path = module.__file__ or ""
    ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    return module


@dataclass(frozen=True)
class Library:
    """A backend library, opened: its path and the address of each entry point it defines."""

    path: str
    handle: ctypes.CDLL
    entry_points: dict[str, int]

    def entry(self, name: str) -> int | None:
        return self.entry_points.get(name)


def open_library(backend: str, path: str) -> Library:
    """Open backend ``backend``'s library at ``path`` (RTLD_NOW | RTLD_LOCAL, as Triton)."""
    host()
    try:
        handle = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        raise InferpoolError(
            Code.INVALID_ARG,
            f"unable to load backend library '{path}' of backend '{backend}': {exc}",
        ) from None
    found = {}
    for name in ENTRY_POINTS:
        try:
            function = getattr(handle, name)
        except AttributeError:
            continue
        found[name] = ctypes.cast(function, ctypes.c_void_p).value or 0
    if "TRITONBACKEND_ModelInstanceExecute" not in found:
        raise InferpoolError(
            Code.INVALID_ARG,
            f"backend library '{path}' does not define TRITONBACKEND_ModelInstanceExecute",
        )
    return Library(path, handle, found)
