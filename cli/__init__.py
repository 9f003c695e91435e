"""inferpool: a Triton-style model server as a broker and a pinned shared-memory worker pool.

Every package installs under this namespace (``inferpool.broker``, ``inferpool.workers``,
``inferpool.shm``, ``inferpool.backends``, ``inferpool.client``, ``inferpool.wire``); their
folders sit at the top of the repository (a package-dir mapping in pyproject.toml).  This
module stays light: workers import the namespace before they are pinned.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
