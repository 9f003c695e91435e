"""Triton's import name for the python backend's utilities, as a Triton model.py expects:
``import triton_python_backend_utils as pb_utils`` gives inferpool's implementation
(:mod:`inferpool.backends.python.pb_utils`), the very same module object."""

import sys
from typing import TYPE_CHECKING

from inferpool.backends.python import pb_utils

if TYPE_CHECKING:  # what type checkers see; at run time the module *is* pb_utils
    from inferpool.backends.python.pb_utils import *  # noqa: F403

sys.modules[__name__] = pb_utils
