"""Model parameters as Triton's backends read them: ``parameters { key: ... value: {
string_value: ... } }`` entries parsed as booleans or integers, with one error wording for
every backend that reads them."""

from __future__ import annotations

from inferpool.backends.api import Model
from inferpool.wire.errors import invalid_arg

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")


def bool_parameter(model: Model, key: str) -> bool | None:
    """A boolean parameter as Triton's ``ParseBoolValue`` reads it, or None when absent."""
    raw = model.parameter(key)
    if raw is None:
        return None
    value = raw.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise invalid_arg(
        f"parameter '{key}' of model '{model.name}': failed to convert '{raw}' to boolean "
        "(expected true/false, on/off or 1/0)"
    )


def int_parameter(model: Model, key: str) -> int | None:
    """An integer parameter as Triton's ``ParseIntValue`` reads it, or None when absent."""
    raw = model.parameter(key)
    if raw is None:
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise invalid_arg(
            f"parameter '{key}' of model '{model.name}': failed to convert '{raw}' to integral "
            "number"
        ) from None
