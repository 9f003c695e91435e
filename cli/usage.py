"""Values the command line takes, and its mistakes: one clear line and exit status 2.

Parsers of the subcommands raise :class:`UsageError` naming the flag and what was wrong;
``inferpool.entry_point.main`` prints it as ``inferpool: <message>``, as argparse does its own.
The argparse types below raise ``ArgumentTypeError`` with the form they expect.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable
from typing import Any, NoReturn

from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.logs import LEVELS

_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


class UsageError(Exception):
    """A command-line value that cannot be used; the message names the flag."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one line (``inferpool serve: argument ...``)
    without the usage block, a mistyped choice with the nearest one suggested."""

    def error(self, message: str) -> NoReturn:
        wrong = _CHOICE.search(message)
        if wrong:
            choices = re.findall(r"'([^']*)'", wrong.group(2))
            guess = nearest(wrong.group(1), choices)
            hint = f"; did you mean '{guess}'?" if guess else ""
            message = f"{message[: wrong.start()]}invalid choice: '{wrong.group(1)}'{hint} "
            message += f"(choose from {', '.join(choices)})"
        self.exit(2, f"{self.prog}: {message}\n")


def nearest(word: str, choices: Iterable[str]) -> str:
    """The choice closest to a mistyped ``word``, or "" when none is close."""
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else ""


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


def parse_resource(text: str) -> str:
    """Triton's --rate-limit-resource <name>:<count>[:<device>]."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(
            f"expected <name>:<count> or <name>:<count>:<device>, got {text!r}"
        )
    return text


def listen_endpoint(text: str) -> str:
    """A zmq endpoint to listen on (an argparse type): ``ipc://`` and a socket file, or
    ``tcp://`` and an address and port."""
    scheme, sep, rest = text.partition("://")
    host, _, port = rest.rpartition(":")
    if sep and scheme == "ipc" and rest:
        return text
    if (
        sep
        and scheme == "tcp"
        and host
        and (port == "*" or (port.isdigit() and 0 < int(port) < 65536))
    ):
        return text
    raise argparse.ArgumentTypeError(
        f"not an endpoint: {text!r} (an ipc socket file, as ipc:///run/inferpool/broker.sock, "
        "or a tcp address and port, as tcp://127.0.0.1:8710; tcp://*:8710 is every address)"
    )


def is_unknown_model(err: InferpoolError, model: str) -> bool:
    """Whether ``err`` says the server does not know ``model`` (Triton's words, or an
    unload's): only then is the server asked which models it has (a server that does not
    answer is not asked twice)."""
    about = (f"unknown model: '{model}' is not found", f"unload '{model}': unknown model")
    return err.code is Code.NOT_FOUND and any(text in err.message for text in about)


def unknown_model(err: InferpoolError, model: str, names: Iterable[str]) -> InferpoolError:
    """``err`` (one :func:`is_unknown_model` holds for) with the models the server has, the
    nearest named first."""
    known = sorted(set(names))
    guess = nearest(model, known)
    hint = f"; did you mean '{guess}'?" if guess else ""
    listed = ", ".join(known[:12]) + (f" and {len(known) - 12} more" if len(known) > 12 else "")
    return InferpoolError(err.code, f"{err.message}{hint} (the server has: {listed or 'none'})")
