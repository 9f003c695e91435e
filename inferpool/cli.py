"""The ``inferpool`` command: serve a model repository, and talk to a running server."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from inferpool import __version__
from inferpool.backends import template
from inferpool.commands import add_client_commands
from inferpool.control_commands import add_control_commands
from inferpool.serve import add_serve
from inferpool.wire.errors import InferpoolError


# ============================================================================ new-backend
def add_new_backend(sub: Any) -> None:
    p = sub.add_parser(
        "new-backend",
        help="write a working backend from the template",
        description=template.DESCRIPTION,
    )
    template.add_arguments(p)
    p.set_defaults(func=lambda args: template.run(args, "inferpool new-backend"))


# ============================================================================ main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferpool", description=__doc__)
    parser.add_argument("--version", action="version", version=f"inferpool {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve(sub)
    add_client_commands(sub)
    add_control_commands(sub)
    add_new_backend(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except InferpoolError as err:
        print(f"inferpool: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
