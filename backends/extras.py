"""Optional packages a built-in backend needs: imported when the backend loads a model, with
one clear error naming the extra that installs them where they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from inferpool.wire.errors import unavailable


def require(module: str, backend: str, extra: str) -> ModuleType:
    """Import ``module`` for ``backend``; UNAVAILABLE naming ``pip install 'inferpool[extra]'``
    when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise unavailable(
            f"backend '{backend}' needs the Python package '{module}', which is not installed "
            f"({exc}): pip install 'inferpool[{extra}]'"
        ) from None
