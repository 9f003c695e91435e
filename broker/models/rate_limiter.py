"""The rate limiter (``--rate-limit execution_count``): Triton's resources and priorities.

An instance group's ``rate_limiter`` names the resources each of its instances needs to
execute (``global`` ones are shared by the whole server, the others are per device) and a
``priority``.  A batch a scheduler gives an instance runs only once the instance holds its
resources; until then it is staged, and the instance is reserved for it.  When resources
are released, staged instances get them in the order of their scaled priority (executions
so far times ``max(priority, 1)``: priority 2 gets half the chances of priority 1), first
staged first among equals, and only the first in that order may take them (a later one is
not let past it), as Triton's rate limiter does.  An instance that finishes a batch and has
another stages it before it releases what it held, so it competes for it too.

How many of a resource there are: ``--rate-limit-resource NAME:COUNT[:DEVICE]`` (without a
device: on every device), else the most any loaded instance needs.  Triton's load errors: a
resource both global and per-device, or fewer of one than an instance needs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from inferpool.wire.errors import invalid_arg

GLOBAL = -1  # the device key of global resources
PER_DEVICE = -2  # the device key of --rate-limit-resource counts given without a device
Needs = dict[int, dict[str, int]]  # device (or GLOBAL) -> resource -> count


@dataclass
class _Instance:
    needs: Needs
    priority: int
    executions: int = 0
    holds: bool = False
    staged: Any = None  # the payload waiting for the resources
    order: int = 0  # when it was staged


@dataclass
class RateLimiter:
    """Triton's rate limiter: resources and priorities between the schedulers and the instances."""

    explicit: Needs = field(default_factory=dict)
    _instances: dict[Any, _Instance] = field(default_factory=dict)
    _allocated: dict[int, dict[str, int]] = field(default_factory=dict)
    _counter: Any = field(default_factory=itertools.count)

    @classmethod
    def from_options(cls, resources: Iterable[str]) -> RateLimiter:
        """``--rate-limit-resource`` values (checked by the command line already)."""
        explicit: Needs = {}
        for item in resources:
            name, count, *device = item.split(":")
            key = int(device[0]) if device else PER_DEVICE
            explicit.setdefault(key, {})[name] = int(count)
        return cls(explicit)

    # ------------------------------------------------------------------ instances
    def add(self, instance: Any, config: Any, group: str, device_id: int) -> None:
        """Register ``instance`` of group ``group`` of ``config`` on ``device_id``;
        INVALID_ARG (Triton's words) if the server could never run it."""
        limiter = _group(config, group).rate_limiter
        needs: Needs = {}
        for r in limiter.resources:
            key = GLOBAL if getattr(r, "global") else device_id  # a keyword in Python
            needs.setdefault(key, {})[r.name] = int(r.count)
        entry = _Instance(needs, max(int(limiter.priority), 1))
        self._instances[instance] = entry
        try:
            self._check(self.available())
        except BaseException:
            del self._instances[instance]
            raise

    def remove(self, instance: Any) -> None:
        self._instances.pop(instance, None)

    def available(self) -> Needs:
        """How many of each resource there are, by device."""
        most: Needs = {}
        for entry in self._instances.values():
            for key, counts in entry.needs.items():
                have = most.setdefault(key, {})
                for name, count in counts.items():
                    have[name] = max(have.get(name, 0), count)
        if not self.explicit:
            return most
        given: Needs = {}
        for key, counts in most.items():
            for name in counts:
                sources = (
                    self.explicit.values()
                    if key == GLOBAL
                    else (self.explicit.get(key, {}), self.explicit.get(PER_DEVICE, {}))
                )
                given.setdefault(key, {})[name] = max((s.get(name, 0) for s in sources), default=0)
        return given

    def _check(self, available: Needs) -> None:
        shared = set(available.get(GLOBAL, {}))
        for key, counts in available.items():
            for name in counts:
                if key != GLOBAL and name in shared:
                    raise invalid_arg(
                        f'Resource "{name}" is present as both global and device-specific '
                        "resource in the model configuration."
                    )
        for entry in self._instances.values():
            for key, counts in entry.needs.items():
                for name, count in counts.items():
                    limit = available.get(key, {}).get(name, 0)
                    if limit < count:
                        raise invalid_arg(
                            f'Resource count for "{name}" is limited to {limit} which will '
                            "prevent scheduling of one or more model instances, the minimum "
                            f"required count is {count}"
                        )

    # ------------------------------------------------------------------ execution
    def acquire(self, instance: Any, payload: Any) -> list[tuple[Any, Any]]:
        """Stage ``payload`` for ``instance``; returns the (instance, payload) pairs that may
        run now (``instance``'s among them if its resources are free)."""
        entry = self._instances.get(instance)
        if entry is None:  # not registered: nothing limits it
            return [(instance, payload)]
        entry.staged = payload
        entry.order = next(self._counter)
        return self._grant()

    def release(self, instance: Any) -> list[tuple[Any, Any]]:
        """``instance`` finished its batch: its resources go to the staged instances that
        may run now, returned as (instance, payload) to be sent."""
        entry = self._instances.get(instance)
        if entry is not None and entry.holds:
            entry.holds = False
            for key, counts in entry.needs.items():
                for name, count in counts.items():
                    self._allocated[key][name] -= count
        return self._grant()

    def forget(self, instance: Any) -> list[tuple[Any, Any]]:
        """``instance`` is gone: its staged payload is dropped (its requests fail with it)
        and what it held is released; returns what may run now."""
        entry = self._instances.get(instance)
        if entry is not None:
            entry.staged = None
        return self.release(instance)

    def _grant(self) -> list[tuple[Any, Any]]:
        granted = []
        available = self.available()
        staged = sorted(  # (one still holding what its last batch took waits for it)
            (e.executions * e.priority, e.order, i)
            for i, e in self._instances.items()
            if e.staged is not None and not e.holds
        )
        for _, _, instance in staged:
            entry = self._instances[instance]
            if not self._fits(entry.needs, available):
                break  # nothing passes the first in line
            for key, counts in entry.needs.items():
                held = self._allocated.setdefault(key, {})
                for name, count in counts.items():
                    held[name] = held.get(name, 0) + count
            entry.holds = True
            entry.executions += 1
            granted.append((instance, entry.staged))
            entry.staged = None
        return granted

    def _fits(self, needs: Needs, available: Needs) -> bool:
        for key, counts in needs.items():
            held = self._allocated.get(key, {})
            for name, count in counts.items():
                if held.get(name, 0) + count > available.get(key, {}).get(name, 0):
                    return False
        return True


def _group(config: Any, name: str) -> Any:
    """The group ``name`` of a config whose groups are completed (pool.instance_groups)."""
    for group in config.instance_group:
        if group.name == name:
            return group
    raise invalid_arg(f"model '{config.name}' has no instance group '{name}'")


class Gate:
    """Between the schedulers and the workers: a batch goes to its instance at once, or,
    with a rate limiter, once the instance holds its resources (until then the instance is
    reserved for it: busy, and never past an execute timeout)."""

    def __init__(
        self, send: Callable[[Any, Any, Any, Any], None], limiter: RateLimiter | None
    ) -> None:
        self.send = send  # (instance, batch, release, nulls): the Execute message goes out
        self.limiter = limiter

    def add(self, instance: Any, config: Any, group: str, device_id: int) -> None:
        if self.limiter is not None:
            self.limiter.add(instance, config, group, device_id)

    def remove(self, instance: Any) -> None:
        if self.limiter is not None:
            self.limiter.remove(instance)

    def dispatch(self, instance: Any, batch: Any, release: Any, nulls: Any) -> None:
        """With a rate limiter (without one, the caller sends the batch itself)."""
        assert self.limiter is not None
        instance.exec_started = math.inf
        self._run(self.limiter.acquire(instance, (batch, release, nulls)))

    def done(self, instance: Any, gone: bool = False) -> None:
        """``instance`` finished its batch (or is gone): its resources go to the next."""
        if self.limiter is not None:
            limiter = self.limiter
            self._run(limiter.forget(instance) if gone else limiter.release(instance))

    def _run(self, granted: list[tuple[Any, Any]]) -> None:
        for instance, (batch, release, nulls) in granted:
            self.send(instance, batch, release, nulls)
