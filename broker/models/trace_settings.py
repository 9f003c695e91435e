"""Triton's trace settings: global and per model, read and changed while the server runs.

A setting has a level (none: OFF; TIMESTAMPS, TENSORS or both), a sampling rate (every
rate-th request is traced), a count (how many traces are left to collect; -1: no limit), a
log frequency (0: traces go to the trace file; N: every N traces go to ``<file>.<index>``)
and the trace file, which only the command line sets.  As in Triton, a model's setting
names the fields it sets and takes the others from the global setting, whose unset fields
come from the command line; a cleared field (null, or an empty list over gRPC) is taken
from there again, and a model left with none of its own follows the global setting.  Each
change makes a new setting: its counters start over, and the traces the old one held are
written out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from inferpool.wire.errors import Code, InferpoolError, invalid_arg

LEVELS = ("TIMESTAMPS", "TENSORS")
FIELDS = ("level", "rate", "count", "log_frequency")
API_NAMES = {"trace_level": "level", "trace_rate": "rate", "trace_count": "count"}
API_NAMES["log_frequency"] = "log_frequency"
UINT32 = (1 << 32) - 1
INT32 = (1 << 31) - 1


@dataclass
class TraceSetting:
    """One setting, and what it has sampled since it was made."""

    level: tuple[str, ...] = ()  # () is OFF
    rate: int = 1000
    count: int = -1  # traces left to collect; -1: no limit
    log_frequency: int = 0
    file: str = ""
    specified: frozenset[str] = frozenset()  # the FIELDS this setting sets itself
    seen: int = 0  # requests it was asked to sample
    sampled: int = 0  # traces it started
    collected: int = 0  # traces written (or waiting for log_frequency)
    pending: list[Any] = field(default_factory=list)  # finished traces (roots) not written yet
    retired: bool = False  # a change replaced it: its late traces are written as they come

    def why_invalid(self) -> str:
        """Why this setting cannot trace ("" when it can), as Triton says it."""
        if not self.level:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if not self.file:
            return "trace file name is not given"
        if self.count == 0:
            return "trace count is 0: there are no traces left to collect"
        return ""

    def sample(self) -> bool:
        """Whether the request asking now is traced (every rate-th, while count lasts)."""
        if self.count == 0 or not self.level or not self.rate or not self.file:
            return False
        self.seen += 1
        if self.seen % self.rate:
            return False
        if self.count > 0:
            self.count -= 1
        self.sampled += 1
        return True

    def to_api(self) -> dict[str, Any]:
        """The setting as Triton's trace extension answers it."""
        return {
            "trace_level": list(self.level) or ["OFF"],
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
            "log_frequency": str(self.log_frequency),
            "trace_file": self.file,
            "trace_mode": "triton",
        }


class TraceSettings:
    """The settings in force: the command line's, the global one, the models' own."""

    def __init__(
        self,
        start: TraceSetting,
        model_ready: Callable[[str], bool],
        retired: Callable[[TraceSetting], None],
    ) -> None:
        """``start``: the command line's setting; ``model_ready(name)``: whether a model
        may be named; ``retired`` gets each setting a change replaced (it writes out the
        traces the setting still holds)."""
        self.default = replace(start, specified=frozenset(), pending=[])
        self.global_ = replace(start, specified=frozenset(), pending=[])
        self.models: dict[str, TraceSetting] = {}
        self.following: set[str] = set()  # models whose setting takes fields from the global
        self.model_ready = model_ready
        self.retired = retired
        self.on = bool(self.global_.why_invalid() == "")

    def of(self, model: str) -> TraceSetting:
        """The setting that traces ``model``'s requests."""
        return self.models.get(model) or self.global_

    def all(self) -> list[TraceSetting]:
        return [self.global_, *self.models.values()]

    def changed(self) -> None:
        """Whether any setting can trace, looked at again (a count ran out, a change)."""
        self.on = any(s.why_invalid() == "" for s in self.all())

    def answer(self, model: str, changes: Mapping[str, Any] | None) -> dict[str, Any]:
        """The ``trace_setting`` message: apply ``changes`` (Triton's names) to the global
        setting or ``model``'s, then answer the setting in force."""
        if model and not self.model_ready(model):
            raise invalid_arg(f"Request for unknown model : {model}")
        if changes:
            self.update(model, parse(changes))
        return self.of(model).to_api()

    def update(self, model: str, new: dict[str, Any]) -> None:
        """Set the fields ``new`` names (None: clear it) for ``model`` ("" : global)."""
        self._update(model, new)
        if not model:  # the models that follow it follow the change
            for name in list(self.following):
                self._update(name, {})
        self.changed()

    def _update(self, model: str, new: dict[str, Any]) -> None:
        current = self.models.get(model) if model else self.global_
        fallback = self.global_ if model else self.default
        values = {name: getattr(fallback, name) for name in FIELDS}
        specified = set()
        for name in FIELDS:
            if name in new and new[name] is None:
                continue  # cleared: the fallback's
            if name in new:
                values[name] = new[name]
                specified.add(name)
            elif current is not None and name in current.specified:
                values[name] = getattr(current, name)
                specified.add(name)
        setting = TraceSetting(**values, file=fallback.file, specified=frozenset(specified))
        why = setting.why_invalid()
        if why and setting.level:
            raise invalid_arg(f"Attempting to set invalid trace setting :{why}")
        if model and not specified:  # nothing of its own: the model follows the global
            self.following.discard(model)
            gone = self.models.pop(model, None)
            if gone is not None:
                self.retired(gone)
            return
        if model:
            self.following.add(model)
            old = self.models.get(model)
            self.models[model] = setting
        else:
            old, self.global_ = self.global_, setting
        if old is not None:
            self.retired(old)


def parse(changes: Mapping[str, Any]) -> dict[str, Any]:
    """A client's changes (Triton's names; HTTP's JSON values, or gRPC's lists of strings)
    as the fields they set, None for those they clear; Triton's errors."""
    if "trace_file" in changes:
        raise InferpoolError(
            Code.UNSUPPORTED, "trace file location can not be updated through network protocol"
        )
    new: dict[str, Any] = {}
    for key, value in changes.items():
        name = API_NAMES.get(key)
        if name is None:
            if key == "trace_mode" and value in ("triton", ["triton"]):
                continue
            raise invalid_arg(f"unknown trace setting '{key}'")
        if value is None or value == []:
            new[name] = None
        elif name == "level":
            new[name] = _level(value)
        else:
            new[name] = _number(key, value)
    return new


def _level(value: Any) -> tuple[str, ...]:
    names = value if isinstance(value, list) else [value]
    if not all(isinstance(n, str) for n in names):
        raise invalid_arg("'trace_level' must be a list of strings")
    if "OFF" in names:
        if len(names) > 1:
            raise invalid_arg("Expect only one trace level 'OFF' is specified")
        return ()
    for name in names:
        if name not in LEVELS:
            raise invalid_arg(f"unknown trace level '{name}': expected OFF, TIMESTAMPS or TENSORS")
    return tuple(level for level in LEVELS if level in names)


def _number(key: str, value: Any) -> int:
    """A count, rate or frequency: Triton sends them as strings."""
    if isinstance(value, list):
        if len(value) != 1:
            raise invalid_arg(f"expect only 1 value for '{key}'")
        value = value[0]
    low, high = (-1, INT32) if key == "trace_count" else (0, UINT32)
    try:
        number = int(value) if type(value) is int or isinstance(value, str) else None
    except ValueError:
        number = None
    if number is None:
        raise invalid_arg(f"Unable to parse '{key}', got: {value}")
    if key == "trace_count" and number < low:
        raise invalid_arg(f"Unable to parse '{key}'. Expecting value >= {low}, got: {value}")
    if not low <= number <= high:
        raise invalid_arg(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {value}"
        )
    return number
