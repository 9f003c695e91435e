"""``inferpool serve``'s flags, in groups by concern (``inferpool serve --help`` shows them so).

Each group's function adds its flags; ``inferpool.serve.options_from_args`` reads them into
the broker's ``ServerOptions``.  Triton's names where Triton has the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

from inferpool.triton_flags import triton_groups
from inferpool.usage import (
    listen_endpoint,
    parse_bool,
    parse_port,
    parse_resource,
    parse_size,
    parse_slice,
    seconds,
)
from inferpool.wire.paths import DEFAULT_TCP, default_ipc_endpoint

TRITON_BACKEND_DIRECTORY = "/opt/tritonserver/backends"  # Triton's --backend-directory default

# the KServe frontends' listeners: flag stem, default port (Triton's), what it serves
LISTENERS = (
    ("http", 8000, "serve KServe v2 HTTP/REST here, health included"),
    ("grpc", 8001, "serve KServe v2 gRPC here"),
    (
        "health",
        0,
        "serve only the health endpoints (/v2/health/live, /v2/health/ready, "
        "/v2/models/<m>/ready) here, e.g. for probes while --http-port is 0",
    ),
)


def add_serve_options(p: Any) -> None:
    """Every flag of ``inferpool serve``, group by group."""
    for group in (
        _repository,
        _endpoints,
        _kserve,
        _memory,
        _scheduling,
        _workers,
        _supervision,
        _observability,
        *triton_groups,
    ):
        group(p)


def _repository(p: Any) -> None:
    g = p.add_argument_group("model repository", "what is served, and how models load")
    g.add_argument(
        "--model-repository",
        metavar="DIR",
        default=None,
        help="Triton-layout model repository (default: the embedded examples)",
    )
    g.add_argument(
        "--model-control-mode",
        choices=("none", "explicit", "poll"),
        default="none",
        help="none: load every model at start and on SIGHUP; explicit: only what "
        "--load-model names and clients load; poll: load at start, then follow the "
        "repository every --repository-poll-secs (default: %(default)s)",
    )
    g.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="MODEL",
        help="with --model-control-mode explicit: load this model at start ('*': all); repeatable",
    )
    g.add_argument(
        "--repository-poll-secs",
        type=seconds,
        default=15.0,
        metavar="SECONDS",
        help="with --model-control-mode poll: how often the repository is compared with what "
        "is loaded (default: %(default)g)",
    )
    g.add_argument(
        "--strict-readiness",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ready only while every model is ready (default: %(default)s)",
    )
    g.add_argument(
        "--exit-on-error",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="exit (status 1) when a model fails to load at start; false: serve the others "
        "(default: true)",
    )
    g.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="serve every config as written: no config is completed from the model's files "
        "or by its backend, so each model needs a config.pbtxt with all its backend needs",
    )
    g.add_argument(
        "--strict-model-config",
        type=parse_bool,
        default=None,
        metavar="BOOL",
        help="deprecated: true is --disable-auto-complete-config",
    )
    g.add_argument(
        "--backend-directory",
        default=TRITON_BACKEND_DIRECTORY,
        metavar="DIR",
        help="where backends are looked for after the model's directory: DIR/<backend>/ "
        "(default: Triton's, %(default)s)",
    )
    g.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[B,]KEY=VALUE",
        help="a setting backend B (without B: every backend) reads at initialize; repeatable",
    )


def _endpoints(p: Any) -> None:
    g = p.add_argument_group("endpoints", "where clients connect, and who may")
    g.add_argument(
        "--listen",
        action="append",
        type=listen_endpoint,
        default=None,
        metavar="ENDPOINT",
        help=f"zmq endpoint to bind; repeatable (default: {default_ipc_endpoint()} "
        f"and {DEFAULT_TCP})",
    )
    g.add_argument(
        "--ipc-access",
        choices=("user", "group"),
        default="user",
        help="who may connect to an ipc endpoint: its directory is made 0700 (user) or 0750 "
        "with the socket 0660 (group: members of the directory's group) (default: "
        "%(default)s)",
    )
    g.add_argument(
        "--curve-secret-key",
        default="",
        metavar="FILE",
        help="serve tcp endpoints with CURVE encryption and authentication: the server's "
        "secret certificate (inferpool keygen); needs --curve-authorized-keys",
    )
    g.add_argument(
        "--curve-authorized-keys",
        default="",
        metavar="DIR",
        help="the public certificates (*.key) of the clients allowed on tcp endpoints",
    )


def _memory(p: Any) -> None:
    g = p.add_argument_group("shared memory", "the arenas, what clients may hold, and for how long")
    g.add_argument(
        "--arena-size",
        metavar="SIZE",
        type=parse_size,
        default="256M",
        help="shared-memory arena for request inputs, the most it may grow to "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--output-arena-size",
        metavar="SIZE",
        type=parse_size,
        default="256M",
        help="shared-memory output arena per worker, the most it may grow to "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--max-request-bytes",
        metavar="SIZE",
        type=parse_size,
        default="256M",
        help="largest accepted request (default: %(default)s)",
    )
    g.add_argument(
        "--prefault",
        metavar="SIZE",
        type=parse_size,
        default="4M",
        help="shared memory populated at start in the arena and in each output region, less "
        "for a model whose outputs are smaller; the rest is populated as it is used "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--no-prefault",
        action="store_true",
        help="populate no shared memory at start (--prefault 0)",
    )
    g.add_argument(
        "--max-client-shm",
        metavar="SIZE",
        type=parse_size,
        default="1G",
        help="shared memory the server creates for the inputs of one client process (all "
        "its connections; a tcp host) (default: %(default)s)",
    )
    g.add_argument(
        "--max-shm-total",
        metavar="SIZE",
        type=parse_size,
        default="4G",
        help="shared memory the server creates for the inputs of all clients "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--client-output-share",
        metavar="SIZE",
        type=parse_size,
        default="0",
        help="output memory one client process (a tcp host) may hold unread or as handles "
        "before its requests are refused (default: half of --output-arena-size)",
    )
    g.add_argument(
        "--lease-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long a client holding output handles may stay silent before they are "
        "reclaimed (default: %(default)g; clients send keepalive messages)",
    )


def _scheduling(p: Any) -> None:
    g = p.add_argument_group("scheduling", "the rate limiter, the response cache and lanes")
    g.add_argument(
        "--rate-limit",
        choices=("off", "execution_count"),
        default="off",
        help="execution_count: an instance runs a batch only when the resources its "
        "rate_limiter asks for are free, by priority (default: %(default)s)",
    )
    g.add_argument(
        "--rate-limit-resource",
        type=parse_resource,
        action="append",
        default=[],
        metavar="NAME:COUNT[:DEVICE]",
        help="how many of a rate-limiter resource there are (default: the most any "
        "instance asks for); without DEVICE, on every device; repeatable",
    )
    g.add_argument(
        "--cache-size",
        type=parse_size,
        default=0,
        metavar="BYTES",
        help="shared memory for the response cache of models with response_cache { enable: "
        "true } (e.g. 64M; default: 0, no cache)",
    )
    g.add_argument(
        "--lane-spin-us",
        type=int,
        default=100,
        metavar="US",
        help="how long a worker spins for its lanes' next request before it sleeps, when the "
        "lane's client is pinned to other cores (default 100; 0: never spin)",
    )


def _workers(p: Any) -> None:
    g = p.add_argument_group("workers", "where instances run and how their workers start")
    g.add_argument(
        "--pin",
        choices=("auto", "none"),
        default="auto",
        help="auto: spread instances over cores; none: leave placement to the OS "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--host-policy",
        action="append",
        default=[],
        metavar="NAME,KEY=VALUE",
        help="a host policy instance groups can name (numa-node, cpu-cores); repeatable",
    )
    g.add_argument(
        "--worker-start",
        choices=("zygote", "fresh"),
        default="zygote",
        help="zygote: fork workers from a parent per NUMA node that imported the frameworks "
        "once (they share its memory and start in milliseconds); fresh: start each worker "
        "as a new interpreter (default: %(default)s)",
    )
    g.add_argument(
        "--sched-slice-us",
        type=parse_slice,
        default=300,
        metavar="US",
        help="the scheduler slice the server's processes ask Linux (6.12+) for, so that one "
        "woken by a message runs soon on a busy core (default: %(default)s; 0: the kernel's)",
    )
    g.add_argument(
        "--model-load-gpu-limit",
        action="append",
        default=[],
        metavar="DEVICE:FRACTION",
        help="reject a GPU instance whose load leaves the device more used than FRACTION",
    )


def _supervision(p: Any) -> None:
    g = p.add_argument_group(
        "timeouts, restarts and drains",
        "when a worker is killed or restarted, and how a stop drains",
    )
    g.add_argument(
        "--boot-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="an instance that has not loaded its model within this is FAILED "
        "(default: %(default)g)",
    )
    g.add_argument(
        "--execute-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="kill an instance whose execute runs longer (default: 0, no limit)",
    )
    g.add_argument(
        "--graceful-timeout",
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a stopping worker may take for its finalizers, and the default of "
        "--drain-timeout (default: %(default)g)",
    )
    g.add_argument(
        "--max-restarts",
        metavar="N",
        type=int,
        default=5,
        help="an instance that crashes more often than this within --restart-window is "
        "FAILED (default: %(default)s)",
    )
    g.add_argument(
        "--restart-window",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the window --max-restarts counts crashes in (default: %(default)g)",
    )
    g.add_argument(
        "--heartbeat-ms",
        metavar="MS",
        type=int,
        default=1000,
        help="how often workers are checked for being frozen (SIGSTOP, freezer); one frozen on "
        "two checks in a row is replaced (default: %(default)s; 0: off)",
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on a drain (SIGTERM, SIGINT, POST /drain, `inferpool drain`), how long admitted "
        "requests may finish once admissions stopped (default: --graceful-timeout)",
    )
    g.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long a drain keeps admitting requests while readiness already fails, so "
        "routers that poll readiness stop sending first (default: 0, admissions stop at once)",
    )


def _observability(p: Any) -> None:
    g = p.add_argument_group("metrics")
    g.add_argument(
        "--allow-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="serve Prometheus metrics (default: true)",
    )
    g.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=int,
        default=8002,
        help="the metrics port (default: %(default)s; 0: no metrics)",
    )
    g.add_argument(
        "--metrics-address",
        metavar="ADDRESS",
        default="127.0.0.1",
        help="the metrics address (default: %(default)s)",
    )


def _kserve(p: Any) -> None:
    g = p.add_argument_group(
        "KServe v2 frontends", "Triton's HTTP/REST and gRPC protocols, for Triton's clients"
    )
    for stem, port, serves in LISTENERS:
        g.add_argument(
            f"--{stem}-port",
            type=parse_port,
            default=port,
            metavar="PORT",
            help=f"{serves} (default {port}; 0: off)" if port else f"{serves} (default 0: off)",
        )
        g.add_argument(
            f"--{stem}-address",
            default="127.0.0.1",
            metavar="ADDRESS",
            help="its address (default: 127.0.0.1)",
        )
    sizes = (
        ("--http-max-input-size", "the largest HTTP request body (413 beyond it)"),
        ("--grpc-max-input-size", "the largest gRPC message (RESOURCE_EXHAUSTED beyond it)"),
    )
    for flag, what in sizes:
        g.add_argument(
            flag,
            metavar="SIZE",
            type=parse_size,
            default=0,
            help=f"{what} (default: --max-request-bytes and 64M)",
        )
    g.add_argument(
        "--http-body-budget",
        metavar="SIZE",
        type=parse_size,
        default=0,
        help="the request-body bytes all HTTP requests may hold while they arrive; a body "
        "that would pass it is refused with 503 (default: twice --http-max-input-size)",
    )
    g.add_argument(
        "--http-header-timeout",
        metavar="SECONDS",
        type=seconds,
        default=60.0,
        help="how long a connection may take to send a request's headers, at its start or "
        "after its last response, before it is closed (default: %(default)g)",
    )
    g.add_argument(
        "--http-body-timeout",
        metavar="SECONDS",
        type=seconds,
        default=60.0,
        help="how long a request body may take to arrive once its headers are in (408 after "
        "it; default: %(default)g)",
    )
