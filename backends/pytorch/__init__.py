"""The built-in ``pytorch`` backend (also platform ``pytorch_libtorch``).

Loads ``<version>/model.pt`` (TorchScript) or a ``model.pt2`` named by
``default_model_filename`` (torch.export / AOTInductor) and serves it with Triton's
libtorch-backend semantics; see ``backend.py`` for the map of the package.
"""

from inferpool.backends.pytorch.backend import PyTorchBackend

BACKEND = PyTorchBackend

__all__ = ["BACKEND"]
