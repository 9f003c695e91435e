"""Mistakes on the command line: one clear line and exit status 2, never a traceback.

Parsers of the subcommands raise :class:`UsageError` naming the flag and what was wrong;
``inferpool.cli.main`` prints it as ``inferpool: <message>``, as argparse does its own.
"""

from __future__ import annotations

import argparse
from typing import Any


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
