"""The client subcommands: ``infer``, ``models``, ``status``, ``stats``."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from inferpool.broker.pool.topology import format_cpu_list
from inferpool.client import Client, default_endpoint
from inferpool.wire import codec


def common_options() -> argparse.ArgumentParser:
    """The flags every client subcommand takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--endpoint",
        default=None,
        help=f"server endpoint (default: $INFERPOOL_ENDPOINT or {default_endpoint()})",
    )
    common.add_argument("--timeout", type=float, default=60.0)
    return common


def add_client_commands(sub: Any) -> None:
    common = common_options()

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
        datatype = codec.config_to_wire_datatype(spec.get("data_type", "TYPE_FP32"))
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
            dtype=codec.numpy_dtype(datatype),
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
        print(f"{name} {codec.datatype_of(arr.dtype)} {list(arr.shape)}: {_jsonable(arr)}")
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
