"""``inferpool bench MODEL``: its options, and one run from connecting to the reports."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from inferpool.bench.display import Display, print_tables
from inferpool.bench.results import Level, to_csv
from inferpool.bench.runner import Plan, Runner
from inferpool.bench.tensors import build_inputs, parse_shapes
from inferpool.bench.transports import CHOICES, Workload, transport_named
from inferpool.client import AsyncClient
from inferpool.usage import UsageError


def add_bench(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "bench",
        parents=[common],
        help="measure a model's latency and throughput at several concurrencies",
        description="A perf_analyzer for inferpool: N concurrent senders per level, client "
        "latency percentiles and throughput, the server's breakdown of the same window.",
    )
    p.add_argument("model", help="the model's name")
    p.add_argument(
        "--concurrency",
        type=_counts,
        default=(1,),
        metavar="N,N,...",
        help="concurrent requests of each level (default: 1)",
    )
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:DIMS",
        help="an input's shape without the batch dimension, e.g. INPUT0:3x224x224; needed "
        "for variable dims; repeatable",
    )
    p.add_argument("--batch-size", type=int, default=1, help="batch of each request (default: 1)")
    p.add_argument(
        "--input-data",
        default="random",
        metavar="random|zero|FILE",
        help="input values: random, zero, or a .npz / .json file of arrays by input name "
        "(default: random)",
    )
    p.add_argument(
        "--transport",
        choices=sorted(CHOICES),
        default="zmq",
        help="; ".join(f"{name}: {what}" for name, what in sorted(CHOICES.items()))
        + " (default: %(default)s)",
    )
    p.add_argument(
        "--url",
        metavar="HOST:PORT",
        help="where --transport http or grpc sends (default: localhost:8000 for http, "
        "localhost:8001 for grpc, as Triton); statistics still come from --endpoint",
    )
    window = p.add_mutually_exclusive_group()
    window.add_argument(
        "--duration",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="how long each level is measured (default: 5)",
    )
    window.add_argument(
        "--requests", type=int, default=0, help="measure each level over this many requests"
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="requests sent before each level's window, not measured (default: 1)",
    )
    p.add_argument("--model-version", default="", help="default: the highest ready version")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON")
    p.add_argument("--csv", metavar="PATH", help="write one row per level as CSV")
    p.add_argument(
        "--plot", metavar="PATH", help="draw latency and throughput against concurrency (PNG)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.set_defaults(func=cmd_bench)


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(c) for c in text.split(",") if c.strip())
    except ValueError:
        counts = ()
    if not counts or any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"expected counts such as 1,4,16, got {text!r}")
    return counts


def cmd_bench(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.requests < 0 or args.duration <= 0 or args.warmup < 0:
        raise UsageError(
            "--batch-size and --duration must be positive, --requests and --warmup not negative"
        )
    levels, about = asyncio.run(_bench(args))
    print_tables(levels, about)
    report = {**about, "levels": [lv.to_dict() for lv in levels]}
    _write(args.json, json.dumps(report, indent=2) + "\n", "--json")
    _write(args.csv, to_csv(levels), "--csv")
    if args.plot:
        from inferpool.bench.plot import plot

        plot(levels, about, args.plot)
    return 0


async def _bench(args: argparse.Namespace) -> tuple[list[Level], dict[str, Any]]:
    async with AsyncClient(args.endpoint, timeout=args.timeout) as control:
        config = await control.model_config(args.model, args.model_version)
        shapes = parse_shapes(args.shape)
        inputs, datatypes = build_inputs(config, shapes, args.input_data, args.batch_size)
        decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled"))
        workload = Workload(args.model, args.model_version, inputs, datatypes, decoupled)

        async def statistics() -> dict[str, Any]:
            stats = await control.statistics(args.model, args.model_version)
            return dict(stats["model_stats"][0])

        version = (await statistics())["version"]
        duration = 0.0 if args.requests else args.duration
        plan = Plan(args.concurrency, duration, args.requests, args.warmup)
        transport = transport_named(args.transport)(
            args.endpoint, args.timeout, workload, max(plan.concurrency), args.url
        )
        await transport.open()
        try:
            senders = [await transport.sender() for _ in range(max(plan.concurrency))]
            with Display(quiet=args.quiet) as display:
                levels = await Runner(senders, statistics, plan, args.batch_size, display).run()
        finally:
            await transport.close()
    about = {
        "model": args.model,
        "version": version,
        "transport": args.transport,
        "batch_size": args.batch_size,
        "inputs": {
            name: {"datatype": datatypes[name], "shape": list(arr.shape)}
            for name, arr in inputs.items()
        },
        "window": {"duration_s": plan.duration, "requests": plan.requests, "warmup_s": plan.warmup},
    }
    return levels, about


def _write(path: str | None, text: str, flag: str) -> None:
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None
