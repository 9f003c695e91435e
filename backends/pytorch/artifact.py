"""Loading a model file: TorchScript (``model.pt``) or a torch.export archive (``model.pt2``).

A ``.pt2`` file is either an ``ExportedProgram`` saved by ``torch.export.save`` or an
AOTInductor package from ``torch._inductor.aoti_compile_and_package``; the archive's
contents tell which.  Every kind is reduced to the same surface: the forward arguments (for
the naming rules), a callable, and the ``nn.Module`` whose parameters may be shared.
"""

from __future__ import annotations

import os
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree

from inferpool.backends.pytorch.naming import Arg
from inferpool.wire.errors import unavailable

DEFAULT_FILENAME = "model.pt"
_TS_KINDS = {"TensorType": "tensor", "ListType": "list", "DictType": "dict"}


@dataclass
class Artifact:
    """A loaded model file: how to call it, its arguments and its module."""

    path: str
    format: str  # "torchscript", "exported" or "aoti"
    args: list[Arg]
    forward: Callable[..., Any]
    module: torch.nn.Module | None  # parameters/buffers that weight sharing may move


def find(artifact_dir: str, filename: str, instance: str) -> str:
    """The model file's path; UNAVAILABLE naming it when it is missing."""
    path = os.path.join(artifact_dir, filename or DEFAULT_FILENAME)
    if not os.path.isfile(path):
        raise unavailable(f"unable to find '{path}' for model instance '{instance}'")
    return path


def load(path: str, device: torch.device | None, model: str) -> Artifact:
    """Load ``path`` onto ``device`` (None: where the file says, for KIND_MODEL).  Not in
    inference mode: weights made there are inference tensors, and torch's matmul then runs a
    batch of 3-D inputs against them as a bmm, not one mm (a BERT-base encoder at batch 8:
    1.6x the CPU)."""
    try:
        with torch.no_grad():
            if path.endswith(".pt2"):
                return _load_aoti(path, device) if _is_aoti(path) else _load_exported(path, device)
            return _load_torchscript(path, device)
    except Exception as exc:
        raise unavailable(f"failed to load model '{model}' from '{path}': {exc}") from exc


def _load_torchscript(path: str, device: torch.device | None) -> Artifact:
    with warnings.catch_warnings():  # TorchScript is what model.pt is; torch 2.13 deprecates it
        warnings.filterwarnings("ignore", "`torch.jit.load` is deprecated", DeprecationWarning)
        module = torch.jit.load(path, map_location=device)
    arguments = list(module.forward.schema.arguments)
    if arguments and arguments[0].type.kind() == "ClassType":
        arguments = arguments[1:]  # self
    args = [Arg(a.name, _TS_KINDS.get(a.type.kind(), "other"), str(a.type)) for a in arguments]
    # the compiled method itself: calling the module adds nn.Module's Python dispatch (hooks
    # a loaded TorchScript module cannot have had scripted in) to every execution
    return Artifact(path, "torchscript", args, module.forward, module)


def _is_aoti(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/data/aotinductor/" in name for name in archive.namelist())
    except zipfile.BadZipFile:
        return False  # let torch.export.load report what is wrong with it


def _spec_args(in_spec: Any, names: list[str]) -> list[Arg]:
    """Forward arguments from a pytree spec of ``(args, kwargs)``."""
    positional = in_spec.children()[0].children()
    args = []
    for i, spec in enumerate(positional):
        if spec.is_leaf():
            kind = "tensor"
        elif spec.type is dict:
            kind = "dict"
        elif spec.type in (list, tuple):
            kind = "list"
        else:
            kind = "other"
        name = names[i] if i < len(names) else ""
        args.append(Arg(name, kind, "Tensor" if kind == "tensor" else str(spec.type)))
    return args


def _load_exported(path: str, device: torch.device | None) -> Artifact:
    program = torch.export.load(path)
    if device is not None and device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    signature = program.module_call_graph[0].signature
    names = list(signature.forward_arg_names or []) if signature is not None else []
    module = program.module()
    return Artifact(path, "exported", _spec_args(program.call_spec.in_spec, names), module, module)


def _load_aoti(path: str, device: torch.device | None) -> Artifact:
    from torch._inductor import aoti_load_package

    index = device.index if device is not None and device.index is not None else -1
    compiled = aoti_load_package(path, device_index=index)
    built_for = compiled.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
    if device is not None and built_for != device.type:
        raise RuntimeError(
            f"AOTInductor package was compiled for '{built_for}' but the instance runs on "
            f"'{device.type}'"
        )
    in_spec = _pytree.treespec_loads(compiled.loader.get_call_spec()[0])
    return Artifact(path, "aoti", _spec_args(in_spec, []), compiled, None)
