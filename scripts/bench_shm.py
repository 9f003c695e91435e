#!/usr/bin/env python3
"""How much /dev/shm a served run really holds: the default ``inferpool serve`` measured.

Starts ``inferpool serve`` (the embedded example repository unless ``--model-repository``)
with the default shared-memory options, and sums, over every region of the run, the bytes
tmpfs has allocated to it (``st_blocks``, so a sparse region counts only what was touched):
once the models are ready, then after ``--requests`` identity requests of each size in
``--sizes``.  Prints one line per moment and writes JSON (``--json``).

    python scripts/bench_shm.py
    python scripts/bench_shm.py --sizes 64 1M 16M --requests 20
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inferpool.client import Client  # noqa: E402
from inferpool.shm.runs import SHM_DIR, regions_of_run  # noqa: E402
from inferpool.usage import parse_size  # noqa: E402

MiB = 1 << 20


def resident(run_id: str) -> dict[str, int]:
    """Bytes tmpfs holds for each region of ``run_id`` (allocated blocks, not the size)."""
    out = {}
    for name in regions_of_run(run_id):
        try:
            out[name] = os.stat(os.path.join(SHM_DIR, name)).st_blocks * 512
        except FileNotFoundError:
            continue
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "server.log", "wb") as log:
        endpoint = f"ipc://{tmp}/broker.sock"
        cmd = [sys.executable, "-m", "inferpool", "serve", "--listen", endpoint]
        cmd += ["--http-port", "0", "--grpc-port", "0", *args.serve_args]  # zmq only
        if args.model_repository:
            cmd += ["--model-repository", args.model_repository]
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
        try:
            with Client(endpoint, timeout=60) as client:
                client.wait_ready(120)
                run_id = str(client.server_metadata()["run_id"])
                rows = [{"moment": "ready", "regions": resident(run_id)}]
                for size in args.sizes:
                    data = np.ones(max(1, size // 4), np.float32)
                    for _ in range(args.requests):
                        client.infer("identity", {"INPUT0": data})
                    rows.append({"moment": f"after {size} B", "regions": resident(run_id)})
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return {"rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-repository", default="")
    parser.add_argument("--sizes", nargs="*", type=parse_size, default=[64, MiB, 16 * MiB])
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--json", default="bench-shm.json")
    parser.add_argument(
        "serve_args", nargs="*", help="more `inferpool serve` options (after --)", default=[]
    )
    args = parser.parse_args()
    result = measure(args)
    for row in result["rows"]:
        regions = row["regions"]
        total = sum(regions.values())
        print(f"{row['moment']:>18}: {total / MiB:8.1f} MiB resident in {len(regions)} regions")
    Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
