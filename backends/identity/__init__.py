"""The identity backend: every OUTPUT<i> is a copy of INPUT<i>, as Triton's identity backend."""

from backends.identity.backend import BACKEND

__all__ = ["BACKEND"]
