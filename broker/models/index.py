"""The repository index: every model of the repository, loaded or not, as Triton lists it.

A model that is loaded (or failed to load, or is loading or unloading) has one row per
version with its state and reason; one that was unloaded keeps its versions as
``UNAVAILABLE`` with the reason ``unloaded``; one that was never loaded is its name alone
(version, state and reason empty).  Models loaded from override files, which are not in
the repository, are listed while they are loaded.
"""

from __future__ import annotations

import logging
from typing import Any

from inferpool.broker.models import repository
from inferpool.broker.models.registry import Registry, State
from inferpool.wire.errors import InferpoolError

log = logging.getLogger("inferpool.index")


def repository_index(registry: Registry, root: str, ready_only: bool) -> list[dict[str, Any]]:
    """The repository index: each model on disk or loaded, with its state."""
    rows = registry.index(ready_only)
    if ready_only:
        return rows
    try:
        on_disk = repository.list_models(root)
    except InferpoolError as err:  # the repository went away: what is loaded still counts
        log.error("%s", err)
        on_disk = []
    for name in on_disk:
        if name in registry.records:
            continue
        versions = registry.unloaded.get(name)
        if versions:
            rows += [_row(name, str(v), State.UNAVAILABLE.value, "unloaded") for v in versions]
        else:
            rows.append(_row(name, "", "", ""))
    return sorted(rows, key=lambda r: (r["name"], _number(r["version"])))


def _row(name: str, version: str, state: str, reason: str) -> dict[str, Any]:
    return {"name": name, "version": version, "state": state, "reason": reason}


def _number(version: str) -> int:
    return int(version) if version.isdigit() else -1
