"""Reloading the repository (SIGHUP) and replacing a serving model without failing a request.

A reload compares each model directory's fingerprint (``repository.fingerprint``) with the
one it was loaded from: unchanged models are not touched (same workers, same queue), new
ones load, removed ones unload after serving what they had queued, and changed ones are
replaced: the new configuration's workers start beside the old ones, requests switch to
the new version once it is READY, and the old workers finish their queue and stop.  A new
configuration that fails to load leaves the old one serving, with the failure as its note.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from inferpool.broker.models import repository
from inferpool.broker.models.registry import ModelRecord, Registry
from inferpool.wire.errors import InferpoolError

log = logging.getLogger("inferpool.reload")
Waiter = Callable[[InferpoolError | None], None]


class Lifecycle(Protocol):
    """What a reload asks of the models' lifecycle (``models.lifecycle``)."""

    repository: str
    registry: Registry
    pending: dict[str, ModelRecord]  # replacements loading beside their model
    retiring: list[ModelRecord]  # records whose workers are stopping
    load_waiters: dict[str, list[Waiter]]

    def load(self, name: str, waiter: Waiter | None = None) -> None: ...

    def unload(self, name: str, *, graceful: bool = False) -> None: ...

    def build(self, name: str) -> ModelRecord:
        """A record for the model as it is on disk now, its workers starting."""
        ...

    def check_loaded(self, name: str) -> None: ...

    def retire(self, record: ModelRecord, graceful: bool, why: str = "is unloading") -> None: ...


@dataclass
class ReloadPlan:
    """What a reload does, by model name."""

    load: list[str] = field(default_factory=list)  # new on disk
    replace: list[str] = field(default_factory=list)  # changed on disk
    unload: list[str] = field(default_factory=list)  # gone from disk
    busy: list[str] = field(default_factory=list)  # changed, but still loading: next time
    unchanged: list[str] = field(default_factory=list)


def plan_reload(models: Lifecycle) -> ReloadPlan:
    """Compare the repository on disk with what is loaded."""
    plan = ReloadPlan()
    root = models.repository
    records = models.registry.records
    on_disk = repository.list_models(root)
    plan.unload = sorted(set(records) - set(on_disk))
    for name in on_disk:
        record = records.get(name)
        if record is None:
            plan.load.append(name)
        elif repository.fingerprint(f"{root}/{name}") == record.fingerprint:
            plan.unchanged.append(name)
        elif name in models.pending or any(
            r is record for r in models.retiring
        ):  # a reload or unload of it is still under way
            plan.busy.append(name)
        else:
            plan.replace.append(name)
    return plan


def reload_repository(models: Lifecycle, done: Waiter | None = None) -> ReloadPlan:
    """Apply :func:`plan_reload`; ``done`` hears once every load and replacement settled."""
    plan = plan_reload(models)
    changed = plan.load or plan.replace or plan.unload or plan.busy
    log.log(
        logging.INFO if changed else logging.DEBUG,
        "reload: %d new, %d changed, %d removed, %d unchanged%s",
        len(plan.load),
        len(plan.replace),
        len(plan.unload),
        len(plan.unchanged),
        f"; still busy, left for the next reload: {', '.join(plan.busy)}" if plan.busy else "",
    )
    waiting = set(plan.load) | set(plan.replace)

    def settled(name: str) -> Waiter:
        def waiter(_err: InferpoolError | None) -> None:
            waiting.discard(name)
            if not waiting and done is not None:
                done(None)

        return waiter

    for name in plan.unload:
        models.unload(name, graceful=True)
    for name in plan.load + plan.replace:
        models.load(name, settled(name))
    if not waiting and done is not None:
        done(None)
    return plan


def replace(models: Lifecycle, current: ModelRecord, waiter: Waiter | None) -> None:
    """Load ``current``'s model again beside it and switch to it once it has loaded."""
    name = current.name
    new = models.build(name)
    if new.error is not None:
        _switch(models, current, new, repository.poll_failure(name, new.error), waiter)
        return
    models.pending[name] = new
    models.load_waiters.setdefault(name, []).append(
        lambda err: _switch(models, current, new, err, waiter)
    )
    models.check_loaded(name)


def _switch(
    models: Lifecycle,
    old: ModelRecord,
    new: ModelRecord,
    err: InferpoolError | None,
    waiter: Waiter | None,
) -> None:
    if models.pending.get(new.name) is new:
        del models.pending[new.name]
    if err is not None:
        old.note = f"reload failed, serving the previous configuration: {err.message}"
        old.fingerprint = new.fingerprint  # tried: the next reload waits for another change
        log.error("model '%s': %s", old.name, old.note)
        models.retire(new, graceful=False)
    else:
        for version, mv in new.versions.items():
            if version in old.versions:  # statistics carry on across the reload
                mv.stats = old.versions[version].stats
        models.registry.records[new.name] = new
        log.info("model '%s' reloaded; the previous workers finish their queue", new.name)
        models.retire(old, graceful=True, why="was reloaded")
    if waiter:
        waiter(err)
