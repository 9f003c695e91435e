"""The ``inferpool`` command: serve a model repository, and talk to a running server."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from backends import template
from broker import __version__
from broker.gpu_limit import parse_gpu_limits
from broker.options import DEFAULT_TCP, ServerOptions, default_ipc_endpoint
from broker.topology import format_cpu_list
from client import Client, InferpoolError, default_endpoint, wire

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def default_repository() -> str:
    """The embedded example repository (examples/model_repository, installed as package data)."""
    try:
        import examples

        return os.path.join(os.path.dirname(os.path.abspath(examples.__file__)), "model_repository")
    except ImportError:
        return os.path.join(EXAMPLES, "model_repository")


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


def parse_backend_config(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """Triton's --backend-config=<backend>,<key>=<value>."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        backend, sep, setting = item.partition(",")
        key, eq, value = setting.partition("=")
        if not sep or not eq or not backend or not key:
            raise SystemExit(f"--backend-config expects <backend>,<key>=<value>, got {item!r}")
        out.setdefault(backend, {})[key] = value
    return out


# ============================================================================ serve
def add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a model repository")
    p.add_argument(
        "--model-repository",
        default=None,
        help="Triton-layout model repository (default: the embedded examples)",
    )
    p.add_argument(
        "--listen",
        action="append",
        default=None,
        metavar="ENDPOINT",
        help=f"zmq endpoint to bind; repeatable (default: {default_ipc_endpoint()} "
        f"and {DEFAULT_TCP})",
    )
    p.add_argument(
        "--arena-size",
        type=parse_size,
        default="256M",
        help="shared-memory arena for request inputs (default 256M)",
    )
    p.add_argument(
        "--output-arena-size",
        type=parse_size,
        default="256M",
        help="shared-memory output arena per worker (default 256M)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=parse_size,
        default="256M",
        help="largest accepted request (default 256M)",
    )
    p.add_argument(
        "--max-client-shm",
        type=parse_size,
        default="1G",
        help="shared memory the server creates for one client's inputs (default 1G)",
    )
    p.add_argument(
        "--lease-timeout",
        type=float,
        default=60.0,
        help="seconds a client holding output handles may stay silent before they are "
        "reclaimed (default 60; clients send keepalive messages)",
    )
    p.add_argument(
        "--no-prefault",
        action="store_true",
        help="do not touch arena pages at start (less memory, slower first requests)",
    )
    p.add_argument("--model-control-mode", choices=("none", "explicit"), default="none")
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        help="with --model-control-mode explicit: load this model at start ('*': all)",
    )
    p.add_argument("--strict-readiness", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--backend-directory", default="")
    p.add_argument("--backend-config", action="append", default=[], metavar="B,KEY=VALUE")
    p.add_argument("--host-policy", action="append", default=[], metavar="NAME,KEY=VALUE")
    p.add_argument(
        "--pin",
        choices=("auto", "none"),
        default="auto",
        help="auto: spread instances over cores; none: leave placement to the OS",
    )
    p.add_argument(
        "--execute-timeout",
        type=float,
        default=0.0,
        help="kill an instance whose execute runs longer (seconds; 0: no limit)",
    )
    p.add_argument("--boot-timeout", type=float, default=120.0)
    p.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, how long in-flight requests may finish (seconds)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="an instance that crashes more often than this within --restart-window is FAILED",
    )
    p.add_argument("--restart-window", type=float, default=60.0, metavar="SECONDS")
    p.add_argument(
        "--heartbeat-ms",
        type=int,
        default=1000,
        help="how often workers are checked for being frozen (SIGSTOP, freezer); one frozen on "
        "two checks in a row is replaced (0: off)",
    )
    p.add_argument(
        "--model-load-gpu-limit",
        action="append",
        default=[],
        metavar="DEVICE:FRACTION",
        help="reject a GPU instance whose load leaves the device more used than FRACTION",
    )
    p.add_argument(
        "--metrics-port", type=int, default=0, help="serve Prometheus metrics here (0: off)"
    )
    p.add_argument("--metrics-address", default="127.0.0.1")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(func=cmd_serve)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    opts = ServerOptions(
        model_repository=os.path.abspath(args.model_repository or default_repository())
    )
    if args.listen:
        opts.listen = list(args.listen)
    opts.arena_size = args.arena_size
    opts.output_arena_size = args.output_arena_size
    opts.max_request_bytes = args.max_request_bytes
    opts.prefault = not args.no_prefault
    opts.max_client_shm = args.max_client_shm
    opts.lease_timeout = args.lease_timeout
    opts.model_control_mode = args.model_control_mode
    opts.load_models = list(args.load_model)
    opts.strict_readiness = args.strict_readiness
    opts.backend_directory = (
        os.path.abspath(args.backend_directory) if args.backend_directory else ""
    )
    opts.backend_config = parse_backend_config(args.backend_config)
    opts.host_policies = list(args.host_policy)
    opts.pin = args.pin != "none"
    opts.execute_timeout = args.execute_timeout
    opts.boot_timeout = args.boot_timeout
    opts.graceful_timeout = args.graceful_timeout
    opts.max_restarts = args.max_restarts
    opts.restart_window = args.restart_window
    opts.heartbeat_ms = args.heartbeat_ms
    opts.model_load_gpu_limit = parse_gpu_limits(args.model_load_gpu_limit)
    opts.metrics_port = args.metrics_port
    opts.metrics_address = args.metrics_address
    opts.log_level = args.log_level.upper()
    return opts


def cmd_serve(args: argparse.Namespace) -> int:
    from broker.server import Broker

    opts = options_from_args(args)
    logging.basicConfig(
        level=getattr(logging, opts.log_level, logging.INFO),
        format="%(asctime)s %(levelname)s [broker] %(name)s: %(message)s",
    )
    broker = Broker(opts)

    def started(b: Broker) -> None:
        for row in b.registry.index():
            reason = f" ({row['reason']})" if row["reason"] else ""
            print(f"  model {row['name']} version {row['version'] or '-'}: {row['state']}{reason}")
        print(
            "inferpool is ready" if b.ready() else "inferpool started, but not every model is ready"
        )
        sys.stdout.flush()

    broker.on_started = started
    print(f"inferpool {__version__}: serving {opts.model_repository}")
    for endpoint in opts.listen:
        print(f"  listening on {endpoint}")
    sys.stdout.flush()
    try:
        broker.start()
    except InferpoolError as err:
        print(f"inferpool: {err}", file=sys.stderr)
        return 1
    return broker.run()


# ============================================================================ client commands
def add_client_commands(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--endpoint",
        default=None,
        help=f"server endpoint (default: $INFERPOOL_ENDPOINT or {default_endpoint()})",
    )
    common.add_argument("--timeout", type=float, default=60.0)

    p = sub.add_parser("infer", parents=[common], help="run one inference and print the outputs")
    p.add_argument("model")
    p.add_argument(
        "--input",
        action="append",
        required=True,
        metavar="NAME=V1,V2,...",
        help="an input's values, comma-separated, or NAME=@file.npy; repeatable",
    )
    p.add_argument(
        "--datatype",
        action="append",
        default=[],
        help="datatype per input, in --input order (default: from the model)",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        help="shape per input, e.g. 2x3 or 2,3 (default: the values as one row)",
    )
    p.add_argument("--output", action="append", default=None, help="output to request; repeatable")
    p.add_argument("--version", default="")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_infer)

    p = sub.add_parser("models", parents=[common], help="list models, versions and their state")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("status", parents=[common], help="show every instance's worker")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("stats", parents=[common], help="print a model's statistics as JSON")
    p.add_argument("model", nargs="?", default="")
    p.set_defaults(func=cmd_stats)


def _parse_input(
    text: str, datatype: str | None, shape: str | None, config: dict[str, Any]
) -> tuple[str, np.ndarray, str]:
    name, eq, values = text.partition("=")
    if not eq or not name:
        raise SystemExit(f"--input expects NAME=V1,V2,..., got {text!r}")
    spec = next((i for i in config.get("input", []) if i.get("name") == name), None)
    if datatype is None:
        if spec is None:
            raise SystemExit(f"model has no input {name!r}; give --datatype to send it anyway")
        datatype = wire.config_to_wire_datatype(spec.get("data_type", "TYPE_FP32"))
    if values.startswith("@"):
        arr = np.load(values[1:], allow_pickle=False)
    elif datatype == "BYTES":
        arr = np.array([v.encode() for v in values.split(",")], dtype=object)
    else:
        arr = np.array(
            [
                float(v) if "." in v or "e" in v.lower() else int(v, 0)
                for v in values.split(",")
                if v
            ],
            dtype=wire.numpy_dtype(datatype),
        )
    if shape:
        dims = [int(d) for d in shape.replace("x", ",").split(",") if d]
        arr = arr.reshape(dims)
    elif not values.startswith("@") and int(config.get("max_batch_size", 0)) > 0:
        arr = arr.reshape(1, -1)
    return name, arr, datatype


def cmd_infer(args: argparse.Namespace) -> int:
    with Client(args.endpoint, timeout=args.timeout) as c:
        config = c.model_config(args.model, args.version)
        inputs: dict[str, Any] = {}
        datatypes: dict[str, str] = {}
        for i, text in enumerate(args.input):
            dt = (
                args.datatype[i]
                if i < len(args.datatype)
                else (args.datatype[0] if len(args.datatype) == 1 else None)
            )
            sh = (
                args.shape[i]
                if i < len(args.shape)
                else (args.shape[0] if len(args.shape) == 1 else None)
            )
            name, arr, datatype = _parse_input(text, dt, sh, config)
            inputs[name] = arr
            datatypes[name] = datatype
        result = c.infer_result(
            args.model, inputs, args.output, version=args.version, datatypes=datatypes
        )
    if args.json:
        print(
            json.dumps(
                {
                    "model_name": result.model_name,
                    "model_version": result.model_version,
                    "outputs": {k: _jsonable(v) for k, v in result.outputs.items()},
                    "parameters": result.parameters,
                }
            )
        )
        return 0
    for name, arr in result.outputs.items():
        print(f"{name} {wire.datatype_of(arr.dtype)} {list(arr.shape)}: {_jsonable(arr)}")
    for key, value in result.parameters.items():
        print(f"  parameter {key} = {value!r}")
    return 0


def _jsonable(arr: np.ndarray) -> Any:
    if arr.dtype == object:
        return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in arr.reshape(-1)]
    return arr.tolist()


def cmd_models(args: argparse.Namespace) -> int:
    with Client(args.endpoint, timeout=args.timeout) as c:
        rows = c.models()
    print(f"{'MODEL':24} {'VERSION':8} {'STATE':12} REASON")
    for r in rows:
        print(f"{r['name']:24} {r['version'] or '-':8} {r['state']:12} {r['reason']}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    with Client(args.endpoint, timeout=args.timeout) as c:
        rows = c.status()
    print(
        f"{'INSTANCE':24} {'MODEL':16} {'PID':>7} {'STATE':9} {'CPUS':10} {'NUMA':12} "
        f"{'DEVICE':8} {'RESTARTS':>8} LAST ERROR"
    )
    for r in rows:
        cpus, numa, device = placement_columns(r)
        print(
            f"{r['instance']:24} {r['model']:16} {r['pid'] or '-':>7} {r['state']:9} "
            f"{cpus:10} {numa:12} {device:8} {r['restarts']:>8} {r['last_error']}"
        )
    return 0


def placement_columns(row: dict[str, Any]) -> tuple[str, str, str]:
    """CPUS, NUMA (nodes and memory policy) and DEVICE of a status row, as the worker
    read them back after pinning (the plan until it has)."""
    placed = row.get("placement") or {}
    planned = row.get("pinning") or {}
    cpus = placed.get("cpus") or planned.get("cpus") or []
    policy = placed.get("mempolicy") or planned.get("mempolicy") or "default"
    nodes = placed.get("numa_nodes") or (
        [planned["numa_node"]] if planned.get("numa_node") is not None else []
    )
    numa = f"{format_cpu_list(nodes) if nodes else '-'} {policy}"
    kind = str(row.get("kind", "CPU"))
    device = f"GPU{row.get('device_id', 0)}" if kind == "GPU" else kind
    return (format_cpu_list(cpus) if cpus else "-"), numa, device


def cmd_stats(args: argparse.Namespace) -> int:
    with Client(args.endpoint, timeout=args.timeout) as c:
        print(json.dumps(c.statistics(args.model), indent=2))
    return 0


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
