"""``inferpool serve``: its options and the broker's run."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inferpool import __version__
from inferpool.model_options import add_model_options, model_options
from inferpool.usage import UsageError
from inferpool.wire.errors import InferpoolError
from inferpool.wire.logs import FORMATS, LEVELS, configure
from inferpool.wire.paths import DEFAULT_TCP, default_ipc_endpoint

if TYPE_CHECKING:
    from inferpool.broker.options import ServerOptions

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def default_repository() -> str:
    """The embedded example repository (examples/model_repository, installed as package data)."""
    try:
        from inferpool import examples

        return os.path.join(os.path.dirname(os.path.abspath(examples.__file__)), "model_repository")
    except ImportError:
        return os.path.join(EXAMPLES, "model_repository")


def parse_size(text: str) -> int:
    """'256M', '1G', '64k' or a plain byte count."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if t and t[-1] in units:
            return int(float(t[:-1]) * units[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size: {text!r} (examples: 256M, 1G, 65536)"
        ) from None


def parse_port(text: str) -> int:
    """A TCP port, 0 (off) to 65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"not a port: {text!r} (0 turns it off; up to 65535)")
    return port


def parse_slice(text: str) -> int:
    """A scheduler slice in microseconds: 0 (the kernel's), or 100 to 100000 (its range)."""
    try:
        us = int(text)
    except ValueError:
        us = -1
    if us != 0 and not 100 <= us <= 100_000:
        raise argparse.ArgumentTypeError(
            f"not a slice: {text!r} (microseconds, 100 to 100000; 0: the kernel's default)"
        )
    return us


def parse_backend_config(items: Sequence[str]) -> dict[str, dict[str, str]]:
    """Triton's --backend-config=<backend>,<key>=<value>, and --backend-config=<key>=<value>
    for every backend (under the backend name "")."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        backend, sep, setting = item.partition(",")
        if not sep and "=" in item:  # a global setting (default-max-batch-size=8)
            backend, setting = "", item
        key, eq, value = setting.partition("=")
        if not eq or not key or (sep and not backend):
            raise UsageError(
                f"--backend-config expects <backend>,<key>=<value> or <key>=<value>, got {item!r}"
            )
        out.setdefault(backend, {})[key] = value
    return out


def parse_bool(text: str) -> bool:
    """Triton's boolean flags: ``--allow-metrics false``."""
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(LEVELS)}, got {text!r}")
    return level


# ============================================================================ serve
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


def add_serve(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve a model repository",
        description="Serve a Triton-layout model repository until SIGTERM or Ctrl-C.",
    )
    p.add_argument(
        "--model-repository",
        default=None,
        help="Triton-layout model repository (default: the embedded examples)",
    )
    p.add_argument(
        "--listen",
        action="append",
        default=None,
        metavar="ENDPOINT",
        help=f"zmq endpoint to bind; repeatable (default: {default_ipc_endpoint()} "
        f"and {DEFAULT_TCP})",
    )
    p.add_argument(
        "--ipc-access",
        choices=("user", "group"),
        default="user",
        help="who may connect to an ipc endpoint: its directory is made 0700 (user) or 0750 "
        "with the socket 0660 (group: members of the directory's group) (default: "
        "%(default)s)",
    )
    p.add_argument(
        "--curve-secret-key",
        default="",
        metavar="FILE",
        help="serve tcp endpoints with CURVE encryption and authentication: the server's "
        "secret certificate (inferpool keygen); needs --curve-authorized-keys",
    )
    p.add_argument(
        "--curve-authorized-keys",
        default="",
        metavar="DIR",
        help="the public certificates (*.key) of the clients allowed on tcp endpoints",
    )
    p.add_argument(
        "--arena-size",
        type=parse_size,
        default="256M",
        help="shared-memory arena for request inputs, the most it may grow to "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--output-arena-size",
        type=parse_size,
        default="256M",
        help="shared-memory output arena per worker, the most it may grow to "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=parse_size,
        default="256M",
        help="largest accepted request (default: %(default)s)",
    )
    p.add_argument(
        "--max-client-shm",
        type=parse_size,
        default="1G",
        help="shared memory the server creates for the inputs of one client process (all "
        "its connections; a tcp host) (default: %(default)s)",
    )
    p.add_argument(
        "--max-shm-total",
        type=parse_size,
        default="4G",
        help="shared memory the server creates for the inputs of all clients "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--client-output-share",
        type=parse_size,
        default="0",
        help="output memory one client process (a tcp host) may hold unread or as handles "
        "before its requests are refused (default: half of --output-arena-size)",
    )
    p.add_argument(
        "--lease-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="how long a client holding output handles may stay silent before they are "
        "reclaimed (default: %(default)g; clients send keepalive messages)",
    )
    p.add_argument(
        "--lane-spin-us",
        type=int,
        default=100,
        metavar="US",
        help="how long a worker spins for its lanes' next request before it sleeps, when the "
        "lane's client is pinned to other cores (default 100; 0: never spin)",
    )
    p.add_argument(
        "--prefault",
        type=parse_size,
        default="4M",
        help="shared memory populated at start in the arena and in each output region, less "
        "for a model whose outputs are smaller; the rest is populated as it is used "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--no-prefault",
        action="store_true",
        help="populate no shared memory at start (--prefault 0)",
    )
    p.add_argument(
        "--model-control-mode",
        choices=("none", "explicit", "poll"),
        default="none",
        help="none: load every model at start and on SIGHUP; explicit: only what "
        "--load-model names and clients load; poll: load at start, then follow the "
        "repository every --repository-poll-secs (default: %(default)s)",
    )
    p.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="MODEL",
        help="with --model-control-mode explicit: load this model at start ('*': all); repeatable",
    )
    p.add_argument(
        "--strict-readiness",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ready only while every model is ready (default: %(default)s)",
    )
    p.add_argument(
        "--backend-directory",
        default="",
        metavar="DIR",
        help="where backends are looked for after the model's directory: DIR/<backend>/",
    )
    p.add_argument(
        "--backend-config",
        action="append",
        default=[],
        metavar="[B,]KEY=VALUE",
        help="a setting backend B (without B: every backend) reads at initialize; repeatable",
    )
    p.add_argument(
        "--host-policy",
        action="append",
        default=[],
        metavar="NAME,KEY=VALUE",
        help="a host policy instance groups can name (numa-node, cpu-cores); repeatable",
    )
    add_model_options(p, parse_size)
    p.add_argument(
        "--pin",
        choices=("auto", "none"),
        default="auto",
        help="auto: spread instances over cores; none: leave placement to the OS "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--sched-slice-us",
        type=parse_slice,
        default=300,
        metavar="US",
        help="the scheduler slice the server's processes ask Linux (6.12+) for, so that one "
        "woken by a message runs soon on a busy core (default: %(default)s; 0: the kernel's)",
    )
    p.add_argument(
        "--execute-timeout",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="kill an instance whose execute runs longer (default: 0, no limit)",
    )
    p.add_argument(
        "--boot-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="an instance that has not loaded its model within this is FAILED "
        "(default: %(default)g)",
    )
    p.add_argument(
        "--graceful-timeout",
        "--exit-timeout-secs",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long a stopping worker may take for its finalizers, and the default of "
        "--drain-timeout (default: %(default)g)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="on a drain (SIGTERM, SIGINT, POST /drain, `inferpool drain`), how long admitted "
        "requests may finish once admissions stopped (default: --graceful-timeout)",
    )
    p.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="how long a drain keeps admitting requests while readiness already fails, so "
        "routers that poll readiness stop sending first (default: 0, admissions stop at once)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="an instance that crashes more often than this within --restart-window is "
        "FAILED (default: %(default)s)",
    )
    p.add_argument(
        "--restart-window",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="the window --max-restarts counts crashes in (default: %(default)g)",
    )
    p.add_argument(
        "--worker-start",
        choices=("zygote", "fresh"),
        default="zygote",
        help="zygote: fork workers from a parent per NUMA node that imported the frameworks "
        "once (they share its memory and start in milliseconds); fresh: start each worker "
        "as a new interpreter (default: %(default)s)",
    )
    p.add_argument(
        "--heartbeat-ms",
        type=int,
        default=1000,
        help="how often workers are checked for being frozen (SIGSTOP, freezer); one frozen on "
        "two checks in a row is replaced (default: %(default)s; 0: off)",
    )
    p.add_argument(
        "--model-load-gpu-limit",
        action="append",
        default=[],
        metavar="DEVICE:FRACTION",
        help="reject a GPU instance whose load leaves the device more used than FRACTION",
    )
    p.add_argument(
        "--allow-metrics",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="serve Prometheus metrics (default: true)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=8002,
        help="the metrics port (default: %(default)s; 0: no metrics)",
    )
    p.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="the metrics address (default: %(default)s)",
    )
    p.add_argument(
        "--log-level",
        type=log_level,
        default="INFO",
        metavar="LEVEL",
        help=f"one of {', '.join(LEVELS)} (default: %(default)s)",
    )
    p.add_argument(
        "--log-verbose",
        type=int,
        default=0,
        metavar="N",
        help="Triton's verbose logging: N > 0 logs at DEBUG (each failed request, ...)",
    )
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text lines, or one JSON object per line with the request id and model where a "
        "line has them (default: %(default)s)",
    )
    kserve = p.add_argument_group(
        "KServe v2 frontends", "Triton's HTTP/REST and gRPC protocols, for Triton's clients"
    )
    for stem, port, serves in LISTENERS:
        kserve.add_argument(
            f"--{stem}-port",
            type=parse_port,
            default=port,
            help=f"{serves} (default {port}; 0: off)" if port else f"{serves} (default 0: off)",
        )
        kserve.add_argument(
            f"--{stem}-address", default="127.0.0.1", help="its address (default: 127.0.0.1)"
        )
    p.set_defaults(func=cmd_serve)


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    # the broker's modules, only for serve: the client commands start without them
    from inferpool.broker.options import ServerOptions, default_listen
    from inferpool.broker.pool.gpu_limit import parse_gpu_limits

    return ServerOptions(
        model_repository=os.path.abspath(args.model_repository or default_repository()),
        listen=tuple(args.listen) if args.listen else default_listen(),
        ipc_access=args.ipc_access,
        curve_secret_key=args.curve_secret_key,
        curve_authorized_keys=args.curve_authorized_keys,
        arena_size=args.arena_size,
        output_arena_size=args.output_arena_size,
        max_request_bytes=args.max_request_bytes,
        prefault=0 if args.no_prefault else args.prefault,
        max_client_shm=args.max_client_shm,
        max_shm_total=args.max_shm_total,
        client_output_share=args.client_output_share,
        lease_timeout=args.lease_timeout,
        lane_spin_us=max(0, args.lane_spin_us),
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        strict_readiness=args.strict_readiness,
        backend_directory=(
            os.path.abspath(args.backend_directory) if args.backend_directory else ""
        ),
        backend_config=parse_backend_config(args.backend_config),
        host_policies=tuple(args.host_policy),
        pin=args.pin != "none",
        sched_slice_us=args.sched_slice_us,
        execute_timeout=args.execute_timeout,
        boot_timeout=args.boot_timeout,
        graceful_timeout=args.graceful_timeout,
        drain_timeout=args.drain_timeout,
        drain_delay=args.drain_delay,
        max_restarts=args.max_restarts,
        restart_window=args.restart_window,
        worker_start=args.worker_start,
        heartbeat_ms=args.heartbeat_ms,
        model_load_gpu_limit=parse_gpu_limits(args.model_load_gpu_limit),
        metrics_port=args.metrics_port if args.allow_metrics else 0,
        metrics_address=args.metrics_address,
        **{
            f"{stem}_{what}": getattr(args, f"{stem}_{what}")
            for stem, _, _ in LISTENERS
            for what in ("port", "address")
        },
        log_level="DEBUG" if args.log_verbose > 0 else args.log_level,
        log_format=args.log_format,
        **model_options(args),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Start the broker; only once everything that can fail at start has been made, say
    where it serves; then serve until a signal stops it."""
    from inferpool.broker.server import Broker, StartInterrupted

    opts = options_from_args(args)
    configure(opts.log_level, opts.log_format, "broker", {"process": "broker"})

    def started(b: Broker) -> None:
        for row in b.registry.index():
            reason = f" ({row['reason']})" if row["reason"] else ""
            print(f"  model {row['name']} version {row['version'] or '-'}: {row['state']}{reason}")
        print(
            "inferpool is ready" if b.ready() else "inferpool started, but not every model is ready"
        )
        sys.stdout.flush()

    try:
        broker = Broker(opts, on_started=started)
    except InferpoolError as err:
        print(f"inferpool: {err}", file=sys.stderr)
        return 1
    except StartInterrupted as stop:
        print(f"inferpool: {stop}; nothing of the run is left", file=sys.stderr)
        return 0
    # what the start made (the imports, the broker's parts) lives as long as the process: out
    # of the collector's reach, a full collection while serving, and the one at exit, do not
    # walk it again (the exit took 0.1 s of CPU for that alone)
    gc.freeze()
    print(f"inferpool {__version__}: serving {opts.model_repository} (run {broker.run_id})")
    for endpoint in opts.listen:
        print(f"  listening on {endpoint}")
    for what, address, port in (
        ("KServe HTTP", opts.http_address, opts.http_port),
        ("KServe gRPC", opts.grpc_address, opts.grpc_port),
        ("health", opts.health_address, opts.health_port),
    ):
        if port:
            print(f"  {what} on {address}:{port}")
    if broker.metrics is not None:
        print(f"  metrics on http://{opts.metrics_address}:{broker.metrics.port}/metrics")
    sys.stdout.flush()
    return broker.run()
