"""Finding and importing a backend, in Triton's search order.

For a model M that names backend B, the places searched are, in order:

1. ``<repo>/M/<version>/``  for ``libtriton_B.so``, ``B.py`` or ``B/__init__.py``
2. ``<repo>/M/``            likewise
3. ``<backend-directory>/B/`` for ``libtriton_B.so``, ``__init__.py``, ``B.py`` or
   ``B/__init__.py``
4. the built-in backends (``backends.<B>``) and the ``inferpool.backends`` entry-point group

In each place Triton's shared library comes first, then the Python forms.  A shared library
is a backend built against Triton's C API (backends/cabi); a backend module defines
``BACKEND``, a :class:`backends.api.Backend` subclass.  The built-in ``python`` backend is
never taken from a ``libtriton_python.so``: Triton's own needs its stub process, and
inferpool's serves model.py itself.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from dataclasses import dataclass
from types import ModuleType

from inferpool.backends.api import Backend
from inferpool.wire.errors import Code, InferpoolError

BUILTIN = ("identity", "python", "pytorch", "onnxruntime", "openvino")
ENTRY_POINT_GROUP = "inferpool.backends"


@dataclass(frozen=True)
class Found:
    """A backend class and where it was found."""

    backend_class: type[Backend]
    location: str  # a file path, "builtin:<module>" or "entry-point:<value>"


def candidates(
    backend: str, repository_path: str, artifact_path: str, backend_directory: str
) -> list[str]:
    """Every file that would be taken as backend ``backend``, in search order."""
    paths = []
    shared = [] if backend == "python" else [_library_name(backend)]
    for d in (artifact_path, repository_path):
        if d:
            paths += [os.path.join(d, f) for f in (*shared, f"{backend}.py")]
            paths.append(os.path.join(d, backend, "__init__.py"))
    if backend_directory:
        d = os.path.join(backend_directory, backend)
        paths += [
            *(os.path.join(d, f) for f in shared),
            os.path.join(d, "__init__.py"),
            os.path.join(d, f"{backend}.py"),
            os.path.join(d, backend, "__init__.py"),
        ]
    return paths


def find_backend(
    backend: str, repository_path: str, artifact_path: str, backend_directory: str = ""
) -> Found:
    """Locate and import backend ``backend``; NOT_FOUND lists every place searched."""
    if not backend.isidentifier():
        raise InferpoolError(
            Code.INVALID_ARG, f"backend name {backend!r} is not a valid identifier"
        )
    searched = candidates(backend, repository_path, artifact_path, backend_directory)
    for path in searched:
        if os.path.isfile(path):
            if path.endswith(".so"):
                from inferpool.backends.cabi.levels import backend_class

                return Found(backend_class(path), path)
            return Found(_backend_class(_import_file(backend, path), path), path)
    if backend in BUILTIN:
        name = f"inferpool.backends.{backend}"
        return Found(_backend_class(importlib.import_module(name), name), f"builtin:{name}")
    searched.append(f"built-in backends ({', '.join(BUILTIN)})")
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == backend:
            loaded = ep.load()
            cls = loaded if isinstance(loaded, type) else _backend_class(loaded, ep.value)
            return Found(_checked(cls, ep.value), f"entry-point:{ep.value}")
    searched.append(f"entry points of group '{ENTRY_POINT_GROUP}'")
    raise InferpoolError(
        Code.NOT_FOUND,
        f"unable to find backend '{backend}'; searched: " + "; ".join(searched),
    )


def _library_name(backend: str) -> str:
    """Triton's name for backend ``backend``'s shared library."""
    return f"libtriton_{backend}.so"


def _import_file(backend: str, path: str) -> ModuleType:
    """Import a backend from a file under a private module name (no sys.path changes)."""
    is_pkg = os.path.basename(path) == "__init__.py"
    modname = f"_inferpool_backend_{backend}_{abs(hash(path)):x}"
    spec = importlib.util.spec_from_file_location(
        modname,
        path,
        submodule_search_locations=[os.path.dirname(path)] if is_pkg else None,
    )
    if spec is None or spec.loader is None:
        raise InferpoolError(Code.INTERNAL, f"cannot import backend '{backend}' from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[modname]
        raise InferpoolError.wrap(
            exc, Code.INVALID_ARG, f"importing backend '{backend}' from {path} failed: "
        ) from exc
    return module


def _backend_class(module: ModuleType, where: str) -> type[Backend]:
    cls = getattr(module, "BACKEND", None)
    if cls is None:
        raise InferpoolError(
            Code.INVALID_ARG,
            f"backend module {where} defines no BACKEND (a backends.api.Backend subclass)",
        )
    return _checked(cls, where)


def _checked(cls: object, where: str) -> type[Backend]:
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise InferpoolError(
            Code.INVALID_ARG, f"BACKEND of {where} is not a backends.api.Backend subclass"
        )
    for attr in ("model_class", "instance_class"):
        if not hasattr(cls, attr):
            raise InferpoolError(Code.INVALID_ARG, f"backend {where} has no {attr}")
    return cls
