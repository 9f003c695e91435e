"""``inferpool serve``: its command, the server options its flags make, and the broker's run."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from inferpool import __version__
from inferpool.serve_flags import LISTENERS, add_serve_options
from inferpool.triton_flags import grpc_ssl, log_settings, trace_setting
from inferpool.usage import UsageError
from inferpool.wire.errors import InferpoolError
from inferpool.wire.logs import configure

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


def add_serve(sub: Any) -> None:
    """``inferpool serve`` and its flags."""
    p = sub.add_parser(
        "serve",
        help="serve a model repository",
        description="Serve a Triton-layout model repository until SIGTERM or Ctrl-C.",
        usage="%(prog)s [options]",
    )
    add_serve_options(p)
    p.set_defaults(func=cmd_serve)


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


def auto_complete_config(args: argparse.Namespace) -> bool:
    """Whether configs are completed: ``--disable-auto-complete-config``, or the deprecated
    ``--strict-model-config=true``, says no (with Triton's warnings on stderr)."""
    strict = args.strict_model_config
    if strict is not None:
        print(
            "Warning: '--strict-model-config' has been deprecated! Please use "
            "'--disable-auto-complete-config' instead.",
            file=sys.stderr,
        )
    if args.disable_auto_complete_config:
        if strict is False:
            print(
                "Warning: Overriding deprecated '--strict-model-config' from False to True in "
                "favor of '--disable-auto-complete-config'!",
                file=sys.stderr,
            )
        return False
    return not strict


def options_from_args(args: argparse.Namespace) -> ServerOptions:
    """The server options ``inferpool serve``'s flags set."""
    # the broker's modules, only for serve: the client commands start without them
    from inferpool.broker.models.trace_settings import TraceSetting
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
        auto_complete_config=auto_complete_config(args),
        exit_on_error=args.exit_on_error,
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
        http_max_input_size=args.http_max_input_size,
        grpc_max_input_size=args.grpc_max_input_size,
        http_header_timeout=args.http_header_timeout,
        http_body_timeout=args.http_body_timeout,
        http_body_budget=args.http_body_budget,
        log=log_settings(args),
        server_id=args.server_id,
        trace=TraceSetting(**trace_setting(args)),
        **grpc_ssl(args),
        repository_poll_secs=args.repository_poll_secs,
        cache_size=args.cache_size,
        rate_limit=args.rate_limit,
        rate_limit_resources=tuple(args.rate_limit_resource),
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Start the broker; only once everything that can fail at start has been made, say
    where it serves; then serve until a signal stops it."""
    from inferpool.broker.server import Broker, StartInterrupted

    opts = options_from_args(args)
    configure(opts.log, "broker", {"process": "broker"}, starting=True)

    def started(b: Broker) -> None:
        for row in b.registry.index():
            reason = f" ({row['reason']})" if row["reason"] else ""
            print(f"  model {row['name']} version {row['version'] or '-'}: {row['state']}{reason}")
        if not b.start_error:
            print(
                "inferpool is ready"
                if b.ready()
                else "inferpool started, but not every model is ready"
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
    for what, address, port, note in (
        ("KServe HTTP", opts.http_address, opts.http_port, ""),
        ("KServe gRPC", opts.grpc_address, opts.grpc_port, opts.frontends().grpc_security),
        ("health", opts.health_address, opts.health_port, ""),
    ):
        if port:
            print(f"  {what} on {address}:{port}{note}")
    if broker.metrics is not None:
        print(f"  metrics on http://{opts.metrics_address}:{broker.metrics.port}/metrics")
    sys.stdout.flush()
    status = broker.run()
    if broker.start_error:  # Triton's line, then how to serve the others anyway
        print(
            f"error: creating server: Internal - {broker.start_error}; "
            "--exit-on-error=false serves the models that loaded",
            file=sys.stderr,
        )
    return status
