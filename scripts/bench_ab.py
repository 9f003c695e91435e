r"""Run one benchmark from two checkouts in alternation: before and after a change, in one run.

    python scripts/bench_ab.py --against /work/main --runs 4 -- \\
        scripts/bench_torch.py --part latency --paths torch backend

Each run starts the benchmark afresh with this checkout's interpreter and then with the
other's (``<checkout>/.venv/bin/python``, whose ``inferpool`` is that checkout's), the order
alternating run by run, so that load coming and going on a shared machine weighs on both
alike.  A benchmark whose paths run in-process (``bench_torch.py``'s ``backend``) cannot
hold two versions of the package in one process; this compares them side by side instead.
The lines of each run's output that match ``--keep`` (its ratios) are printed with the load
average when the run began.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def interpreter(checkout: Path) -> str:
    """The checkout's own interpreter (its virtualenv's), whose ``inferpool`` is its code."""
    python = checkout / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"bench_ab: {checkout} has no .venv/bin/python to run its code with")
    return str(python)


def run(checkout: Path, python: str, command: list[str], keep: re.Pattern[str]) -> list[str]:
    """The kept lines of one run of ``command`` (a script and its arguments) in ``checkout``."""
    done = subprocess.run(
        [python, *command], cwd=checkout, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise SystemExit(f"bench_ab: {command[0]} failed in {checkout}:\n{done.stderr[-2000:]}")
    return [line for line in done.stdout.splitlines() if keep.search(line)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", required=True, help="the other checkout (its .venv runs it)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each checkout")
    parser.add_argument("--keep", default=r" / ", help="regex of the output lines to print")
    parser.add_argument("command", nargs="+", help="the benchmark script and its arguments")
    args = parser.parse_args()
    other = Path(args.against).resolve()
    sides = [("this", HERE, sys.executable), (other.name, other, interpreter(other))]
    keep = re.compile(args.keep)
    for n in range(args.runs):
        for name, checkout, python in sides if n % 2 == 0 else sides[::-1]:
            load = " ".join(f"{v:.2f}" for v in os.getloadavg())
            print(f"run {n + 1}, {name} (load {load}):", flush=True)
            for line in run(checkout, python, args.command, keep):
                print(f"  {line}", flush=True)


if __name__ == "__main__":
    main()
