"""Prometheus' text exposition format (version 0.0.4), written the way Triton writes it.

Triton's counters are named without a suffix (``nv_inference_request_success``, a backend's
``requests_process_latency_ns``), where prometheus-client would append ``_total`` to every
counter; dashboards and alerts written for Triton must find the same names here, so the
families are rendered as declared: ``# HELP``, ``# TYPE`` and one line per sample.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Family:
    """One metric family: its name, help, type (counter or gauge) and samples."""

    name: str
    help: str
    type: str = "counter"
    labels: Sequence[str] = ()
    samples: list[tuple[Sequence[str], float]] = field(default_factory=list)

    def add(self, values: Sequence[str], value: float) -> None:
        """A sample with ``values`` for the family's labels, in order."""
        self.samples.append((values, value))


def render(families: Iterable[Family]) -> bytes:
    """Metric families in Prometheus's text format."""
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {_escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for values, value in family.samples:
            pairs = ",".join(
                f'{k}="{_escape_label(str(v))}"' for k, v in zip(family.labels, values, strict=True)
            )
            labels = f"{{{pairs}}}" if pairs else ""
            lines.append(f"{family.name}{labels} {_number(value)}")
    lines.append("")
    return "\n".join(lines).encode()


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))
