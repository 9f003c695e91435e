"""``inferpool load``, ``inferpool unload`` and ``inferpool drain``: controlling a running server.

``drain`` is the node's drain (as SIGTERM, or ``POST /drain``): the server stops taking
requests, finishes those in flight and exits; it is a Kubernetes preStop hook's command.

``load`` takes Triton's overrides: ``--config`` (JSON, or ``@file`` holding JSON or a
config.pbtxt) replaces the model's configuration, and ``--file 1/model.pt=PATH`` puts a
file of the model directory in place of the repository's (a ``--config`` is then needed).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from inferpool.client import Client
from inferpool.commands import naming_models
from inferpool.wire.errors import invalid_arg


def add_control_commands(sub: Any, common: argparse.ArgumentParser) -> None:
    """The commands that change a running server: load, unload, drain."""
    p = sub.add_parser(
        "load",
        parents=[common],
        help="load (or reload) a model: the server must run with --model-control-mode explicit",
    )
    p.add_argument("model", help="the model's name")
    p.add_argument(
        "--config",
        metavar="JSON|@FILE",
        help="the model's configuration instead of its config.pbtxt: JSON, or @FILE holding "
        "JSON or protobuf text (a config.pbtxt)",
    )
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="PATH_IN_MODEL=FILE",
        help="a file of the model directory, e.g. 1/model.pt=./model.pt; with --file the "
        "repository's directory is not used at all; repeatable",
    )
    p.set_defaults(func=cmd_load)

    p = sub.add_parser("unload", parents=[common], help="unload a model")
    p.add_argument("model", help="the model's name")
    p.set_defaults(func=cmd_unload)

    p = sub.add_parser(
        "drain",
        parents=[common],
        help="drain the server: it stops taking requests, finishes those in flight and exits 0",
    )
    p.set_defaults(func=cmd_drain)


def cmd_load(args: argparse.Namespace) -> int:
    """Load (or reload) a model."""
    config = read_config(args.config) if args.config is not None else None
    files = dict(read_file(item) for item in args.file)
    if files and config is None:
        raise invalid_arg("--file needs --config: the files replace the model's directory")
    with Client(args.endpoint, timeout=args.timeout) as c:
        c.load_model(args.model, config=config, files=files or None)
    print(f"loaded model '{args.model}'")
    return 0


def cmd_unload(args: argparse.Namespace) -> int:
    """Unload a model."""
    with Client(args.endpoint, timeout=args.timeout) as c, naming_models(c, args.model):
        c.unload_model(args.model)
    print(f"unloaded model '{args.model}'")
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    """Drain the server."""
    with Client(args.endpoint, timeout=args.timeout) as c:
        reply = c.drain()
    print(f"draining ({reply['reason']}): {reply['inflight']} request(s) in flight")
    return 0


def read_config(value: str) -> str:
    """The configuration as JSON: given inline, or read from @FILE (JSON or protobuf text)."""
    if not value.startswith("@"):
        text, source = value, "--config"
    else:
        source = value[1:]
        text = _read(source, "--config").decode("utf-8", errors="replace")
    try:
        json.loads(text)
        return text
    except ValueError:
        pass
    from google.protobuf import json_format, text_format  # protobuf text only: imported then
    from tritonclient.grpc import model_config_pb2 as pb

    try:
        config = text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise invalid_arg(
            f"{source} is neither JSON nor a model configuration in protobuf text: {exc}"
        ) from None
    return json_format.MessageToJson(config, preserving_proto_field_name=True)


def read_file(item: str) -> tuple[str, bytes]:
    """``--file 1/model.pt=PATH`` as the load parameter ``file:1/model.pt`` and its bytes."""
    target, eq, path = item.partition("=")
    target = target.removeprefix("file:")
    if not eq or not target or not path:
        raise invalid_arg(
            f"--file expects PATH_IN_MODEL=FILE (e.g. 1/model.pt=./model.pt), got {item!r}"
        )
    return f"file:{target}", _read(path, "--file")


def _read(path: str, flag: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise invalid_arg(f"{flag}: cannot read {path}: {exc.strerror}") from None
