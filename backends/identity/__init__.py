"""The identity backend: every OUTPUT<i> is a copy of INPUT<i>, as Triton's identity backend."""

from inferpool.backends.identity.backend import BACKEND

__all__ = ["BACKEND"]
