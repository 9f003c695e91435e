"""``inferpool serve``'s flags for what Triton's server does as a whole: its name and its
logs (``--id``, ``--log-*``), in groups as ``serve_flags``'s; :func:`log_settings` reads the
log flags into the settings the server starts with.  Triton's names and defaults.
"""

from __future__ import annotations

import argparse
from typing import Any

from inferpool.usage import log_level, parse_bool
from inferpool.wire.logs import ALIASES, FORMATS, LEVELS, LogSettings


def _server(p: Any) -> None:
    g = p.add_argument_group("server")
    g.add_argument(
        "--id",
        dest="server_id",
        default="triton",
        metavar="NAME",
        help="the server's name in server metadata (default: %(default)s, Triton's)",
    )


def _logs(p: Any) -> None:
    g = p.add_argument_group(
        "logs", "what the broker and its workers log; clients may change it (/v2/logging)"
    )
    g.add_argument(
        "--log-level",
        type=log_level,
        default="INFO",
        metavar="LEVEL",
        help=f"the lowest level logged, one of {', '.join(LEVELS)} (default: %(default)s)",
    )
    g.add_argument(
        "--log-verbose",
        type=int,
        default=0,
        metavar="N",
        help="Triton's verbose logging: N > 0 logs at DEBUG (each failed request, ...) and "
        "the start's own lines (default: 0)",
    )
    for level in ("info", "warning", "error"):
        g.add_argument(
            f"--log-{level}",
            type=parse_bool,
            default=True,
            metavar="BOOL",
            help=f"log {level.upper()} lines (default: true)",
        )
    g.add_argument(
        "--log-format",
        choices=(*FORMATS, *ALIASES),
        default="default",
        help="default: text lines; ISO8601: Triton's, with an ISO 8601 time; json: one object "
        "per line with the request id and model where a line has them (default: %(default)s)",
    )
    g.add_argument(
        "--log-file",
        default="",
        metavar="FILE",
        help="append the log to FILE instead of stderr (workers too)",
    )


triton_groups = (_server, _logs)


def log_settings(args: argparse.Namespace) -> LogSettings:
    """The log settings the flags ask for: ``--log-level`` switches off the levels below it
    (DEBUG: verbose), the switches and ``--log-verbose`` add to it."""
    rank = LEVELS.index(args.log_level)
    return LogSettings(
        verbose=max(args.log_verbose, 1 if rank == 0 else 0),
        info=args.log_info and rank <= 1,
        warning=args.log_warning and rank <= 2,
        error=args.log_error and rank <= 3,
        format=ALIASES.get(args.log_format, args.log_format),
        file=args.log_file,
    )
