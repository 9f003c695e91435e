"""One ``inferpool bench`` run: connect, build the workload, drive every level, report."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from inferpool.bench.display import Display, print_tables
from inferpool.bench.results import Level, to_csv
from inferpool.bench.runner import Plan, Runner
from inferpool.bench.tensors import build_inputs, parse_shapes
from inferpool.bench.transports import Workload, transport_named
from inferpool.client import AsyncClient, InferpoolError
from inferpool.usage import UsageError, is_unknown_model, unknown_model


def run(args: argparse.Namespace) -> int:
    """Measure, print the tables, and write what ``--json``, ``--csv`` and ``--plot`` ask for."""
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
        try:
            config = await control.model_config(args.model, args.model_version)
        except InferpoolError as err:
            if not is_unknown_model(err, args.model):
                raise
            names = [r["name"] for r in await control.models()]
            raise unknown_model(err, args.model, names) from None
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
            said = transport.report()
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
        **said,
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
