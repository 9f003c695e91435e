"""Names of POSIX shared-memory objects: which strings may reach shm_open or /dev/shm.

A client names objects, so a name is hostile until checked: a NUL byte crashes the C
library under ``posix_ipc``, ``.``/``..`` name directories, a ``/`` would leave /dev/shm, and
an over-long or unencodable name fails deep in the kernel with an unhelpful error.  Every
name (without its leading slash) passes :func:`check_name` before it is used.
"""

from __future__ import annotations

NAME_MAX = 255  # bytes in one file name


def check_name(name: object) -> str:
    """``name`` if it can name an object in /dev/shm; ValueError saying why not."""
    if not isinstance(name, str) or not name:
        raise ValueError("it is empty")
    if name in (".", ".."):
        raise ValueError("'.' and '..' name directories")
    if "/" in name:
        raise ValueError("only its first character may be '/'")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise ValueError("it contains a control character (NUL, newline, ...)")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise ValueError("it is not valid Unicode text") from None
    if size > NAME_MAX:
        raise ValueError(f"it is {size} bytes long, over the {NAME_MAX} a name may have")
    return name
