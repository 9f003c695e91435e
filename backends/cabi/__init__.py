"""Hosting Triton's C backends: a ``libtriton_<B>.so`` runs in a worker through the
project's own ``libtritonserver.so``."""
