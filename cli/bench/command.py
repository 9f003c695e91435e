"""``inferpool bench MODEL``: its options (the run itself is :mod:`inferpool.bench.session`,
imported only when a benchmark runs: rich, matplotlib and the runner stay out of every other
command's start)."""

from __future__ import annotations

import argparse
from typing import Any

from inferpool.usage import UsageError

# every transport and what it is: their classes (``transports``, with the asyncio clients and
# tritonclient's) are imported only when a benchmark runs
CHOICES = {
    "grpc": "KServe v2 gRPC at --url (tritonclient.grpc.aio)",
    "http": "KServe v2 HTTP at --url (tritonclient.http.aio, binary tensors)",
    "lane": "as shm, through a lane: past the broker, to the model's worker over shared-memory "
    "rings (a model lanes do not serve is refused)",
    "shm": "the asyncio shared-memory client: inputs written in place once, outputs leased",
    "zmq": "the asyncio client: tensors travel in zmq frames",
}


def add_bench(sub: Any, common: argparse.ArgumentParser) -> None:
    """``inferpool bench`` and its flags."""
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
    """Run ``inferpool bench``."""
    if args.batch_size < 1 or args.requests < 0 or args.duration <= 0 or args.warmup < 0:
        raise UsageError(
            "--batch-size and --duration must be positive, --requests and --warmup not negative"
        )
    if args.plot:  # a missing matplotlib is said now, not after the whole benchmark
        from inferpool.bench.plot import pyplot

        pyplot()
    from inferpool.bench.session import run

    return run(args)
