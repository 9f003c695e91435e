"""``inferpool serve``'s flags for what Triton's server does as a whole: its name, its logs
and its traces (``--id``, ``--log-*``, ``--trace-*``), in groups as ``serve_flags``'s;
:func:`log_settings` and :func:`trace_setting` read them into the settings the server
starts with.  Triton's names and defaults.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from inferpool.usage import UsageError, log_level, parse_bool
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


def _traces(p: Any) -> None:
    g = p.add_argument_group(
        "traces",
        "Triton's traces of sampled requests; clients may change them (/v2/trace/setting)",
    )
    g.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[triton,]SETTING=VALUE",
        help="Triton's: level=OFF|TIMESTAMPS|TENSORS (repeatable), rate=N (every N-th request "
        "is traced, default 1000), count=N (traces to collect, default -1: no limit), "
        "triton,file=PATH (where traces are written; needed to trace), "
        "triton,log-frequency=N (every N traces go to PATH.<index>; default 0); repeatable",
    )
    for flag, setting in (
        ("--trace-file", "triton,file"),
        ("--trace-level", "level"),
        ("--trace-rate", "rate"),
        ("--trace-count", "count"),
        ("--trace-log-frequency", "triton,log-frequency"),
    ):
        g.add_argument(
            flag,
            action="append",
            dest="trace_config",
            type=lambda value, s=setting: f"{s}={value}",
            metavar="VALUE",
            help=f"Triton's older form of --trace-config {setting}=VALUE",
        )


def _grpc_ssl(p: Any) -> None:
    g = p.add_argument_group("gRPC over SSL/TLS", "Triton's flags; PEM files")
    g.add_argument(
        "--grpc-use-ssl",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="serve gRPC over SSL/TLS with --grpc-server-cert and --grpc-server-key "
        "(default: false)",
    )
    g.add_argument(
        "--grpc-use-ssl-mutual",
        type=parse_bool,
        default=False,
        metavar="BOOL",
        help="also require each client's certificate, signed by --grpc-root-cert (implies "
        "--grpc-use-ssl; default: false)",
    )
    for flag, what in (
        ("--grpc-server-cert", "the server's certificate chain"),
        ("--grpc-server-key", "the server's private key"),
        ("--grpc-root-cert", "the root certificates clients' certificates must chain to"),
    ):
        g.add_argument(flag, default="", metavar="FILE", help=what)


triton_groups = (_server, _logs, _traces, _grpc_ssl)


def grpc_ssl(args: argparse.Namespace) -> dict[str, Any]:
    """The gRPC SSL options (their files as absolute paths: the frontends read them)."""
    mutual = args.grpc_use_ssl_mutual
    use = args.grpc_use_ssl or mutual
    if use and not (args.grpc_server_cert and args.grpc_server_key):
        raise UsageError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if mutual and not args.grpc_root_cert:
        raise UsageError("--grpc-use-ssl-mutual needs --grpc-root-cert (the clients' CA)")
    files = {
        name: os.path.abspath(path) if path else ""
        for name, path in (
            ("grpc_server_cert", args.grpc_server_cert),
            ("grpc_server_key", args.grpc_server_key),
            ("grpc_root_cert", args.grpc_root_cert),
        )
    }
    return {"grpc_use_ssl": use, "grpc_use_ssl_mutual": mutual, **files}


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


def trace_setting(args: argparse.Namespace) -> dict[str, Any]:
    """The trace setting the ``--trace-*`` flags ask for, as ``TraceSetting``'s fields
    (one clear line for a setting that cannot be used)."""
    fields: dict[str, Any] = {}
    levels: list[str] = []
    for item in args.trace_config:
        mode, _, rest = item.partition(",") if "," in item else ("", "", item)
        key, eq, value = rest.partition("=")
        if not eq or mode not in ("", "triton"):
            raise UsageError(
                f"--trace-config expects [triton,]<setting>=<value> (inferpool traces in "
                f"Triton's own mode), got {item!r}"
            )
        if key == "mode":
            if value != "triton":
                raise UsageError(f"--trace-config mode={value}: inferpool traces in mode triton")
        elif key == "level":
            levels.append(value.upper())
        elif key in ("rate", "count", "log-frequency"):
            fields[key.replace("-", "_")] = _trace_number(key, value)
        elif key == "file":
            fields["file"] = value
        else:
            raise UsageError(f"--trace-config: unknown setting {key!r} in {item!r}")
    for level in levels:
        if level not in ("OFF", "TIMESTAMPS", "TENSORS"):
            raise UsageError(f"--trace-config level={level}: expected OFF, TIMESTAMPS or TENSORS")
    fields["level"] = tuple(x for x in ("TIMESTAMPS", "TENSORS") if x in levels)
    return fields


def _trace_number(key: str, value: str) -> int:
    low = -1 if key == "count" else 0
    try:
        number = int(value)
    except ValueError:
        number = low - 1
    if number < low:
        raise UsageError(f"--trace-config {key}={value}: expected an integer >= {low}")
    return number
