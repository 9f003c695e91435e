"""``inferpool serve`` flags for polling the repository, the response cache and the rate
limiter (Triton's names), and what they set in the server options."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from inferpool.usage import seconds


def _resource(text: str) -> str:
    """Triton's --rate-limit-resource <name>:<count>[:<device>]."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise argparse.ArgumentTypeError(
            f"expected <name>:<count> or <name>:<count>:<device>, got {text!r}"
        )
    return text


def add_model_options(p: Any, size: Callable[[str], int]) -> None:
    """``size`` reads a byte count as serve's other size flags do ("64M")."""
    p.add_argument(
        "--repository-poll-secs",
        type=seconds,
        default=15.0,
        metavar="SECONDS",
        help="with --model-control-mode poll: how often the repository is compared with what "
        "is loaded (default: %(default)g)",
    )
    p.add_argument(
        "--cache-size",
        type=size,
        default=0,
        metavar="BYTES",
        help="shared memory for the response cache of models with response_cache { enable: "
        "true } (e.g. 64M; default: 0, no cache)",
    )
    p.add_argument(
        "--rate-limit",
        choices=("off", "execution_count"),
        default="off",
        help="execution_count: an instance runs a batch only when the resources its "
        "rate_limiter asks for are free, by priority (default: %(default)s)",
    )
    p.add_argument(
        "--rate-limit-resource",
        type=_resource,
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="how many of a rate-limiter resource there are (default: the most any "
        "instance asks for); without DEVICE, on every device; repeatable",
    )


def model_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerOptions fields these flags set."""
    return {
        "repository_poll_secs": args.repository_poll_secs,
        "cache_size": args.cache_size,
        "rate_limit": args.rate_limit,
        "rate_limit_resources": tuple(args.rate_limit_resource),
    }
