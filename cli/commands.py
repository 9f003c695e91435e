"""The client subcommands: ``infer``, ``models``, ``status``, ``stats``."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from inferpool.broker.pool.topology import allowed_cpus, format_cpu_list
from inferpool.client import Client, InferpoolError, default_endpoint
from inferpool.client.core import InferResult
from inferpool.infer_inputs import read_inputs
from inferpool.usage import is_unknown_model, key_value, scalar, seconds, unknown_model
from inferpool.wire import codec

if TYPE_CHECKING:
    from inferpool.client.core import InferOptions

FINAL = "triton_final_response"


@contextlib.contextmanager
def naming_models(c: Client, model: str) -> Iterator[None]:
    """A model the server does not know: its error names the models it has."""
    try:
        yield
    except InferpoolError as err:
        if not is_unknown_model(err, model):
            raise
        raise unknown_model(err, model, [r["name"] for r in c.models()]) from None


def client_options() -> argparse.ArgumentParser:
    """The options every command that talks to a server takes."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--endpoint",
        default=None,
        help=f"server endpoint (default: $INFERPOOL_ENDPOINT or {default_endpoint()})",
    )
    common.add_argument(
        "--timeout",
        type=seconds,
        default=60.0,
        help="seconds to wait for each answer (default: 60)",
    )
    return common


def add_client_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The commands that talk to a running server: infer, models, status, stats."""
    p = sub.add_parser(
        "infer",
        parents=[common],
        help="run one inference and print the outputs (every response of a decoupled model)",
    )
    p.add_argument("model", help="the model's name")
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
    p.add_argument(
        "--parameter",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a request parameter (sequence_id=7, sequence_start=true, priority=1); repeatable",
    )
    p.add_argument("--output", action="append", default=None, help="output to request; repeatable")
    p.add_argument(
        "--model-version", default="", help="the model version (default: the highest ready)"
    )
    p.add_argument("--json", action="store_true", help="print each response as a line of JSON")
    p.set_defaults(func=cmd_infer)

    p = sub.add_parser("models", parents=[common], help="list models, versions and their state")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("status", parents=[common], help="show every instance's worker")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("stats", parents=[common], help="print a model's statistics as JSON")
    p.add_argument("model", nargs="?", default="", help="the model's name (default: every model)")
    p.set_defaults(func=cmd_stats)


def cmd_infer(args: argparse.Namespace) -> int:
    """Run one inference and print its outputs."""
    pairs = (key_value(text, "--parameter") for text in args.parameter)
    parameters = {key: scalar(value) for key, value in pairs}
    with Client(args.endpoint, timeout=args.timeout) as c, naming_models(c, args.model):
        config = c.model_config(args.model, args.model_version)
        inputs, datatypes = read_inputs(args.input, args.datatype, args.shape, config)
        options: InferOptions = {
            "version": args.model_version,
            "parameters": parameters,
            "datatypes": datatypes,
        }
        if config.get("model_transaction_policy", {}).get("decoupled"):
            count = 0
            for count, result in enumerate(c.stream(args.model, inputs, args.output, **options), 1):
                _show(result, args.json, f"[{count}] ")
            if not count and not args.json:
                print(f"model '{args.model}' sent no response with outputs")
        else:
            _show(c.infer_result(args.model, inputs, args.output, **options), args.json)
    return 0


def _show(result: InferResult, as_json: bool, prefix: str = "") -> None:
    """One response: a JSON line, or a line per output and parameter."""
    if as_json:
        body = {
            "model_name": result.model_name,
            "model_version": result.model_version,
            "outputs": {k: _jsonable(v) for k, v in result.outputs.items()},
            "parameters": result.parameters,
        }
        print(json.dumps(body), flush=True)
        return
    for name, arr in result.outputs.items():
        print(f"{prefix}{name} {codec.datatype_of(arr.dtype)} {list(arr.shape)}: {_jsonable(arr)}")
    for key, value in result.parameters.items():
        if key != FINAL:  # what a stream's numbering already shows
            print(f"{prefix}  parameter {key} = {value!r}")
    sys.stdout.flush()


def _jsonable(arr: np.ndarray) -> Any:
    if arr.dtype == object:
        return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in arr.reshape(-1)]
    return arr.tolist()


def cmd_models(args: argparse.Namespace) -> int:
    """Print the repository index."""
    with Client(args.endpoint, timeout=args.timeout) as c:
        rows = c.models()
    print(f"{'MODEL':24} {'VERSION':8} {'STATE':12} REASON")
    for r in rows:
        print(f"{r['name']:24} {r['version'] or '-':8} {r['state']:12} {r['reason']}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """Print every instance's worker."""
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
    print(held_cores_line(rows))
    return 0


def held_cores_line(rows: list[dict[str, Any]]) -> str:
    """Which cores the workers hold and which of this machine's cores none holds: a lane
    client's thread spins (the fast path) only on a core apart from its worker's."""
    held = sorted({c for r in rows if r.get("pid") for c in cores_of(r)})
    free = sorted(set(allowed_cpus()) - set(held))
    return (
        f"cores held by workers: {format_cpu_list(held) if held else 'none pinned'}; "
        f"held by none: {format_cpu_list(free) if free else 'none'} "
        "(a lane client spins on those: docs/performance.md, Lanes)"
    )


def cores_of(row: dict[str, Any]) -> list[int]:
    """The cores a status row's worker holds (as it read them back; the plan until then)."""
    placed = row.get("placement") or {}
    planned = row.get("pinning") or {}
    return list(placed.get("cpus") or planned.get("cpus") or [])


def placement_columns(row: dict[str, Any]) -> tuple[str, str, str]:
    """CPUS, NUMA (nodes and memory policy) and DEVICE of a status row, as the worker
    read them back after pinning (the plan until it has)."""
    placed = row.get("placement") or {}
    planned = row.get("pinning") or {}
    cpus = cores_of(row)
    policy = placed.get("mempolicy") or planned.get("mempolicy") or "default"
    nodes = placed.get("numa_nodes") or (
        [planned["numa_node"]] if planned.get("numa_node") is not None else []
    )
    numa = f"{format_cpu_list(nodes) if nodes else '-'} {policy}"
    kind = str(row.get("kind", "CPU"))
    device = f"GPU{row.get('device_id', 0)}" if kind == "GPU" else kind
    return (format_cpu_list(cpus) if cpus else "-"), numa, device


def cmd_stats(args: argparse.Namespace) -> int:
    """Print the statistics as JSON."""
    with Client(args.endpoint, timeout=args.timeout) as c, naming_models(c, args.model):
        print(json.dumps(c.statistics(args.model), indent=2))
    return 0
