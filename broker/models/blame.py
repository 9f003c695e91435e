"""Whose doing a worker's death was: a client's, when it shrank a registered object under
the batch that read it.

Touching a page that a shrunk object no longer has is SIGBUS, and no check a worker makes
before a batch can close the window between the check and the read (``shm.window``).  Such
a death is the client's: the instance is respawned, but it does not count towards the
crashes that make an instance FAILED, and the requests are told which object it was.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence

from inferpool.broker.models.request import PendingRequest
from inferpool.shm.refs import parse_ref
from inferpool.shm.window import shrunk


def client_fault(batch: Sequence[PendingRequest] | None, code: int) -> str:
    """Why the death of a worker that exited with ``code`` while running ``batch`` is a
    client's doing; "" when it is not."""
    if code != -signal.SIGBUS or not batch:
        return ""
    names: list[str] = []
    for ref in _client_refs(batch):
        obj = parse_ref(ref)
        name = "'/" + obj.name + "'"
        if name not in names and shrunk(obj.name, obj.inode, obj.offset + obj.byte_size):
            names.append(name)
    return shrank_text(names)


def shrank_text(names: Sequence[str]) -> str:
    """The blame for objects ``names`` (quoted) a client shrank ("" for none)."""
    if not names:
        return ""
    return (
        f"reading shared-memory object {', '.join(names)}, which a client shrank while it was "
        "read (not counted as a crash of the instance)"
    )


def _client_refs(batch: Sequence[PendingRequest]) -> Iterator[str]:
    for req in batch:
        for tensor in req.work.inputs:
            if tensor.region.startswith("sys/"):
                yield tensor.region
        for out in req.work.outputs:
            if out.window is not None and out.window.ref.startswith("sys/"):
                yield out.window.ref
