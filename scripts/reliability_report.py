#!/usr/bin/env python3
"""Run the long reliability suite and rewrite the figures of docs/reliability.md.

    python scripts/reliability_report.py            # the long runs (~25 min)
    python scripts/reliability_report.py --short    # the default suite's short runs

Runs ``pytest tests/reliability`` with ``INFERPOOL_LONG_TESTS=1`` (unless ``--short``) and
``INFERPOOL_RELIABILITY_REPORT`` pointing at a temporary file, where each test adds its
figures; then replaces what lies between the figures markers of docs/reliability.md.  The
suite's own assertions still decide: a failing run rewrites nothing and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
START, END = "<!-- figures:start -->", "<!-- figures:end -->"


def run_suite(long: bool, report: Path) -> int:
    env = {**os.environ, "INFERPOOL_RELIABILITY_REPORT": str(report)}
    if long:
        env["INFERPOOL_LONG_TESTS"] = "1"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=3600"]
    return subprocess.call([*cmd, "tests/reliability"], cwd=ROOT, env=env)


def _codes(codes: dict[str, int]) -> str:
    return ", ".join(f"{code} {n:,}" for code, n in sorted(codes.items(), key=lambda c: -c[1]))


def render(figures: dict[str, Any], long: bool) -> str:
    fuzz, chaos = figures["fuzz"], figures["chaos"]
    served = {k: n for k, n in chaos["outcomes"].items() if not k.startswith("client")}
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.cpu_count()} cores ({platform.machine()}, "
        f"Linux {platform.release()}), {'long' if long else 'short'} runs "
        "(`python scripts/reliability_report.py`).",
        "",
        "| fuzz | messages sent | answered | replies by code |",
        "| --- | --- | --- | --- |",
    ]
    kinds = ("structured", "raw", "lane_controls", "lane_records")
    for kind in kinds:
        t = fuzz[kind]
        name = kind.replace("_", " ")
        lines.append(f"| {name} | {t['sent']:,} | {t['answered']:,} | {_codes(t['codes'])} |")
    total = sum(fuzz[kind]["sent"] for kind in kinds)
    lines += [
        "",
        f"{total:,} messages and lane records in {fuzz['seconds']} s; the broker and every "
        "worker lived through all of them, every malformed one was refused by name (no "
        "INTERNAL), the lane the records were written into stayed open, and the arena slots, "
        "output slots, leases, registrations, lanes and requests in flight were back to zero "
        "after each run (`ok`: the registration or input region each batch starts with, the "
        "lanes opened, the records valid by chance).",
        "",
        "| chaos | |",
        "| --- | --- |",
        f"| load | {chaos['clients']} clients for {chaos['seconds']} s, {chaos['rounds']} "
        "round(s) of faults |",
        f"| sent | {chaos['sent']:,} |",
        f"| answered by the server | {chaos['answered']:,} ({_codes(served)}) |",
        f"| lost with a killed broker | {chaos['lost with a killed broker']} (in flight when it "
        "died; each client gave up after its timeout) |",
        f"| unanswered while a broker lived | {chaos['unanswered']} |",
        f"| regions left in /dev/shm | {chaos['regions left']} |",
        f"| broker killed to serving again | {chaos['broker restart (s)']} s (worst) |",
    ]
    for fault, seconds in chaos["worst detection (s)"].items():
        lines.append(f"| worst time to notice: {fault} | {seconds * 1000:.0f} ms |")
    lines += ["", *_truncation(figures["truncation"]), "", *_frontends(figures["frontends"])]
    lines += ["", *_reload(figures["reload"]), "", *_two_users(figures)]
    return "\n".join(lines)


def _truncation(cases: dict[str, dict[str, int]]) -> list[str]:
    lines = ["| region shrunk by its client | outcomes |", "| --- | --- |"]
    for case, outcomes in cases.items():
        lines.append(f"| {case} | {_codes(outcomes)} |")
    lines += [
        "",
        "The server ran with `--max-restarts 0`: a worker death counted against the model "
        "would have made it FAILED, and none did; the broker lived through every case.",
    ]
    return lines


def _frontends(f: dict[str, Any]) -> list[str]:
    limits = ", ".join(f"`{flag} {value}`" for flag, value in f["limits"].items())
    big, stalled = f["big"], f["stalled"]
    http = ", ".join(f"{status} {n:,}" for status, n in f["http bodies"].items())
    return [
        "| KServe frontends | |",
        "| --- | --- |",
        f"| limits of the run | {limits} |",
        f"| hostile HTTP bodies, by status | {http} |",
        f"| hostile gRPC messages | {_codes(f['grpc messages'])} |",
        f"| broken streams: answers in the stream | {_codes(f['grpc stream answers'])} |",
        f"| {big['each (MiB)']} MiB messages and bodies | {_codes(big['refused'])}; the broker's "
        f"RSS grew {big['broker RSS growth (MiB)']} MiB |",
        f"| {stalled['bodies']} bodies stalled at once | "
        f"{', '.join(f'{s} {n}' for s, n in stalled['statuses'].items())}, the last after "
        f"{stalled['seconds to the last answer']} s; the broker's RSS grew "
        f"{stalled['broker RSS growth (MiB)']} MiB |",
    ]


def _reload(r: dict[str, Any]) -> list[str]:
    return [
        "| reloads under load | |",
        "| --- | --- |",
        f"| load | {r['clients']} clients, {r['reloads']} SIGHUP reloads of a changed model |",
        f"| requests | {_codes(r['outcomes'])} |",
        f"| regions in /dev/shm | {r['regions before']} before, {r['regions after']} after, "
        f"{r['most regions seen']} at most |",
    ]


def _two_users(figures: dict[str, Any]) -> list[str]:
    lines = ["| one user keeps its outputs | it held, then | the other user meanwhile |"]
    lines.append("| --- | --- | --- |")
    for key, f in figures.items():
        if key.startswith("two users"):
            other = next(v for k, v in f.items() if k.startswith("other user"))
            lines.append(
                f"| {key.removeprefix('two users ').strip('()')} | {f['hog held (MiB)']} MiB, "
                f"then {f['hog refused']} | {_codes(other)} |"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="the default suite's short runs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "figures.json"
        code = run_suite(not args.short, report)
        if code != 0 or not report.exists():
            print("the reliability suite failed: docs/reliability.md is unchanged")
            return code or 1
        figures = json.loads(report.read_text())
    text = DOC.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{START}\n{render(figures, not args.short)}\n{END}{tail}")
    print(f"rewrote the figures of {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
