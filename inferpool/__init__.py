"""inferpool: a Triton-style model server as a broker and a pinned shared-memory worker pool."""

from broker import __version__

__all__ = ["__version__"]
