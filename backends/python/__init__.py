"""The python backend: ``backend: "python"`` serves a Triton python model's model.py."""

from inferpool.backends.python.backend import BACKEND

__all__ = ["BACKEND"]
