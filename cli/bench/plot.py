"""``--plot out.png``: latency percentiles and throughput against concurrency, for a person
to look at instead of read.  matplotlib is imported only here (``pip install
'inferpool[plot]'``)."""

from __future__ import annotations

from typing import Any

from inferpool.bench.results import PERCENTILES, Level
from inferpool.usage import UsageError


def pyplot() -> Any:
    """matplotlib's pyplot, drawing into files; a UsageError when matplotlib is missing
    (``inferpool bench`` asks before it measures anything)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'inferpool[plot]'") from None
    return plt


def plot(levels: list[Level], about: dict[str, Any], path: str) -> None:
    """Draw latency and throughput by concurrency into ``path`` (matplotlib)."""
    plt = pyplot()
    x = [lv.concurrency for lv in levels]
    fig, (latency, throughput) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    for i, p in enumerate(PERCENTILES):
        latency.plot(x, [lv.latencies_us[i] / 1000 for lv in levels], marker="o", label=f"p{p}")
    latency.set(xlabel="concurrency", ylabel="latency (ms)", title="client latency")
    latency.legend()
    throughput.plot(x, [lv.throughput for lv in levels], marker="o", color="tab:green")
    throughput.set(xlabel="concurrency", ylabel="requests / s", title="throughput")
    for axes in (latency, throughput):
        axes.set_xscale("log", base=2)
        axes.set_xticks(x, [str(c) for c in x])
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
    fig.suptitle(f"inferpool bench {about['model']} ({about['transport']})")
    save(plt, fig, path)


def save(plt: Any, fig: Any, path: str) -> None:
    """Write ``fig`` to ``path`` (``--plot``'s) and close it; a UsageError if it cannot."""
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise UsageError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
