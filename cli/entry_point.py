"""The inferpool command: serve a model repository, and talk to a running server."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import Any

from inferpool import __version__
from inferpool.backends import template
from inferpool.bench.command import add_bench
from inferpool.commands import add_client_commands, client_options
from inferpool.control_commands import add_control_commands
from inferpool.keygen import add_keygen
from inferpool.serve import add_serve
from inferpool.trace_summary import add_trace
from inferpool.usage import Parser, UsageError
from inferpool.wire.errors import InferpoolError

DEBUG_ENV = "INFERPOOL_DEBUG"  # set: an unexpected error shows its traceback


# ============================================================================ new-backend
def add_new_backend(sub: Any) -> None:
    """``inferpool new-backend``: a working backend from the template."""
    p = sub.add_parser(
        "new-backend",
        help="write a working backend from the template",
        description=template.DESCRIPTION,
    )
    template.add_arguments(p)
    p.set_defaults(func=lambda args: template.run(args, "inferpool new-backend"))


class _IncludeDir(argparse.Action):
    """``inferpool --include-dir``: where the headers of Triton's C API are, to build a C
    backend against (``-I$(inferpool --include-dir)``)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kw: Any) -> None:
        from inferpool.backends.cabi.library import include_dir

        print(include_dir())
        parser.exit()


# ============================================================================ main
def build_parser() -> argparse.ArgumentParser:
    """The command line's parser, every subcommand on it."""
    parser = Parser(prog="inferpool", description=__doc__)
    parser.add_argument("--version", action="version", version=f"inferpool {__version__}")
    parser.add_argument(
        "--include-dir",
        action=_IncludeDir,
        nargs=0,
        help="print where the headers of Triton's C API are (for C backends) and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve(sub)
    common = client_options()
    add_client_commands(sub, common)
    add_control_commands(sub, common)
    add_bench(sub, common)
    add_trace(sub)
    add_new_backend(sub)
    add_keygen(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand; a mistake or a server's error is one line on stderr and exit 2."""
    args = build_parser().parse_args(argv)
    gc.freeze()  # the imports last as long as the command: no collection walks them, at exit either
    try:
        return int(args.func(args))
    except (UsageError, InferpoolError) as err:
        return _fail(str(err))
    except OSError as err:  # a file the user named, a closed pipe
        if isinstance(err, BrokenPipeError):
            return 1
        return _fail(f"{err.strerror or err}{f': {err.filename}' if err.filename else ''}")
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if os.environ.get(DEBUG_ENV):
            raise
        return _fail(
            f"unexpected {type(err).__name__}: {err} (a bug: set {DEBUG_ENV}=1 for the "
            "traceback and report it)",
            status=1,
        )


def _fail(message: str, status: int = 2) -> int:
    print(f"inferpool: {message}", file=sys.stderr)
    return status
