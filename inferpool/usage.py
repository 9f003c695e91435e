"""Values the command line takes, and its mistakes: one clear line and exit status 2.

Parsers of the subcommands raise :class:`UsageError` naming the flag and what was wrong;
``inferpool.cli.main`` prints it as ``inferpool: <message>``, as argparse does its own.
The argparse types below raise ``ArgumentTypeError`` with the form they expect.
"""

from __future__ import annotations

import argparse
from typing import Any

from inferpool.wire.logs import LEVELS


class UsageError(Exception):
    """A command-line value that cannot be used; the message names the flag."""


def key_value(text: str, flag: str, form: str = "KEY=VALUE") -> tuple[str, str]:
    """``KEY=VALUE`` split in two, or a UsageError showing the expected form."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise UsageError(f"{flag} expects {form}, got {text!r}")
    return key.strip(), value


def scalar(text: str) -> Any:
    """A request parameter's value as Triton types them: bool, int, float, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def seconds(text: str) -> float:
    """A positive number of seconds (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def parse_size(text: str) -> int:
    """'256M', '1G', '64k' or a plain byte count."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (examples: 256M, 1G, 65536)"
        ) from None


def parse_port(text: str) -> int:
    """A TCP port, 0 (off) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text!r} (0 turns it off; up to 65535)")
    return port


def parse_slice(text: str) -> int:
    """A scheduler slice in microseconds: 0 (the kernel's), or 100 to 100000 (its range)."""
    try:
        us = int(text)
    except ValueError:
        us = -1
    if us != 0 and not 100 <= us <= 100_000:
        raise argparse.ArgumentTypeError(
            f"not a slice: {text!r} (microseconds, 100 to 100000; 0: the kernel's default)"
        )
    return us


def parse_bool(text: str) -> bool:
    """Triton's boolean flags: ``--allow-metrics false``."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def log_level(text: str) -> str:
    """A log level's name, any case (an argparse type)."""
    level = text.strip().upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LEVELS)}, got {text!r}")
    return level
