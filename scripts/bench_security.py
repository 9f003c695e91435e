#!/usr/bin/env python3
"""What the security checks cost a request, as ratios of the request's round trip.

In one run:

- the round trip of an identity request through a real server (client.Client, inputs in
  frames), 64 B and 1 MiB, and of a 64 B request whose input is in a registered region
  (ShmClient), medians;
- the arena scrub: zeroing a freed input slot of 64 B and 1 MiB (``shm.arena.Arena.free``,
  on a pre-faulted region like the server's arena), on the broker's loop once per input;
- the worker's check of a registered window (``shm.window.ObjectWindow.check``: one fstat),
  once per batch that uses the window;
- the per-request look-ups: the client's peer (``front.clients``, cached per connection)
  and its output share (``front.shares``, nothing held: the usual case).

Each cost is timed alone in this process (medians of many runs) and divided by the round
trip of the request it is paid for.  Prints a table; ``--json FILE`` writes the numbers.

    python scripts/bench_security.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_torch import serve  # noqa: E402  (scripts/ is on the path when run as a script)

from inferpool.broker.front.clients import ClientTracker  # noqa: E402
from inferpool.broker.front.shares import OutputShares  # noqa: E402
from inferpool.client import Client, ShmClient  # noqa: E402
from inferpool.shm.arena import Arena  # noqa: E402
from inferpool.shm.region import Region  # noqa: E402
from inferpool.shm.window import ObjectWindow  # noqa: E402

SIZES = [("64 B", 64), ("1 MiB", 1 << 20)]
CONFIG = """
name: "bench"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_UINT8 dims: [ -1 ] } ]
"""


def median_s(fn: Callable[[], Any], runs: int) -> float:
    """Median seconds of ``fn`` over ``runs`` calls (after a tenth as many to warm up)."""
    for _ in range(max(3, runs // 10)):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def start_server(tmp: Path, stack: contextlib.ExitStack) -> str:
    """A real server (stopped with ``stack``) serving the identity model; its endpoint."""
    (tmp / "repo" / "bench" / "1").mkdir(parents=True)
    (tmp / "repo" / "bench" / "config.pbtxt").write_text(CONFIG)
    args = ("--arena-size", "64M", "--output-arena-size", "64M")
    return serve(tmp / "repo", stack, *args).endpoint


def round_trips(endpoint: str, runs: int) -> dict[str, float]:
    out = {}
    with Client(endpoint, timeout=60) as c:
        for label, n in SIZES:
            x = np.zeros(n, np.uint8)
            out[label] = median_s(partial(c.infer, "bench", {"INPUT0": x}), runs)
    name = f"ipt-bench-{os.getpid()}"
    region = Region.create(name, 4096, prefault=True)
    try:
        with ShmClient(endpoint, input_bytes=0) as c:
            c.register_system_shared_memory("in", "/" + name, 4096)
            req = c.request("bench", outputs=[])
            req.input_from("INPUT0", "in", [64], "UINT8", 64)
            req.output_to("OUTPUT0", "in", 64, offset=1024)

            def registered() -> None:
                with c.run(req):
                    pass

            out["64 B, registered region"] = median_s(registered, runs)
    finally:
        region.destroy()
    return out


def scrub_costs(runs: int) -> dict[str, float]:
    """Arena.free with its scrub, less Arena.free without (the allocator's own work)."""
    out = {}
    for scrub in (True, False):
        region = Region.create(f"ipt-bench-arena-{os.getpid()}", 64 << 20, prefault=True)
        try:
            arena = Arena(region, scrub=scrub)
            for label, n in SIZES:

                def cycle(arena: Arena = arena, n: int = n) -> None:
                    arena.free(arena.alloc(n))

                out[(label, scrub)] = median_s(cycle, runs)
        finally:
            arena.destroy()
    return {label: max(0.0, out[(label, True)] - out[(label, False)]) for label, _ in SIZES}


def window_check_cost(runs: int) -> float:
    name = f"ipt-bench-window-{os.getpid()}"
    region = Region.create(name, 4096, prefault=True)
    try:
        st = os.stat(f"/dev/shm/{name}")
        window = ObjectWindow(name, (st.st_dev, st.st_ino), 0, 64)
        batch = iter(range(10**9))
        cost = median_s(lambda: window.check(next(batch)), runs)
        window.close()
        return cost
    finally:
        region.destroy()


def lookup_cost(tmp: Path, runs: int) -> float:
    """A request's peer look-up (cached) and share check (nothing held), in a real ROUTER."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    path = f"ipc://{tmp}/probe.sock"
    router.bind(path)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(path)
    dealer.send_multipart([b"", b"{}"])
    frames = router.recv_multipart(copy=False)
    client = frames[0].bytes
    tracker = ClientTracker([router], 60.0, lambda c: None, lambda c: None)
    shares = OutputShares(1 << 20, lambda c: tracker.peer(c, frames[0]).principal)

    def per_request() -> None:
        tracker.peer(client, frames[0])
        shares.admit(client)

    cost = median_s(per_request, runs)
    tracker.close()
    dealer.close(0)
    router.close(0)
    ctx.term()
    return cost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ipb-", dir="/tmp")))
        endpoint = start_server(tmp, stack)
        trips = round_trips(endpoint, args.runs)
        scrub = scrub_costs(args.runs * 5)
        check = window_check_cost(args.runs * 5)
        lookup = lookup_cost(tmp, args.runs * 5)
    rows = [
        ("arena scrub, 64 B input", scrub["64 B"], trips["64 B"]),
        ("arena scrub, 1 MiB input", scrub["1 MiB"], trips["1 MiB"]),
        ("window check (fstat), per batch", check, trips["64 B, registered region"]),
        ("peer + output share look-up", lookup, trips["64 B"]),
    ]
    print(f"{'cost':36} {'us':>8} {'round trip us':>14} {'ratio':>8}")
    for what, cost, trip in rows:
        print(f"{what:36} {cost * 1e6:8.2f} {trip * 1e6:14.1f} {cost / trip:8.2%}")
    if args.json:
        table = [{"cost": w, "cost_s": c, "round_trip_s": t, "ratio": c / t} for w, c, t in rows]
        Path(args.json).write_text(json.dumps({"round_trips_s": trips, "costs": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
