"""The model repository: Triton's layout, scanned into what should be loaded.

``<repo>/<model>/config.pbtxt`` plus numeric version directories ``<repo>/<model>/<n>/``;
the config's ``version_policy`` (latest / all / specific) picks the versions to load.
A model that cannot be loaded is still listed, UNAVAILABLE with the reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.config import CONFIG_FILE, load_config
from inferpool.wire.errors import Code, InferpoolError


@dataclass
class ModelEntry:
    """A model directory as found on disk: its config and the versions to serve."""

    name: str
    path: str
    config: pb.ModelConfig | None = None
    versions: list[int] = field(default_factory=list)
    error: InferpoolError | None = None
    fingerprint: str = ""  # changes whenever a file of the model changes (see fingerprint())


def list_models(repository: str) -> list[str]:
    """Directory names of the repository that look like models (hidden entries skipped)."""
    try:
        entries = sorted(os.listdir(repository))
    except FileNotFoundError:
        raise InferpoolError(
            Code.NOT_FOUND, f"model repository {repository} does not exist"
        ) from None
    except NotADirectoryError:
        raise InferpoolError(
            Code.INVALID_ARG, f"model repository {repository} is a file, not a directory"
        ) from None
    _not_a_model_directory(repository, entries)
    return [
        e
        for e in entries
        if not e.startswith((".", "_")) and os.path.isdir(os.path.join(repository, e))
    ]


def _not_a_model_directory(repository: str, entries: list[str]) -> None:
    """A model's own directory given as the repository: say so, rather than serve its
    version directories as models."""
    marks = [e for e in entries if e == CONFIG_FILE or (e.isdigit() and int(e) > 0)]
    if marks:
        raise InferpoolError(
            Code.INVALID_ARG,
            f"{repository} looks like a model directory, not a model repository (it has "
            f"{', '.join(marks)}): give the directory that holds the model directories, "
            f"such as {os.path.dirname(os.path.normpath(repository)) or '.'}",
        )


def available_versions(model_dir: str) -> list[int]:
    """The version directories of a model, in order."""
    out = []
    for entry in os.listdir(model_dir):
        if entry.isdigit() and os.path.isdir(os.path.join(model_dir, entry)) and int(entry) > 0:
            out.append(int(entry))
    return sorted(out)


def select_versions(config: pb.ModelConfig, available: list[int]) -> list[int]:
    """Apply the version policy to the version directories present."""
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return list(available)
    if which == "specific":
        return sorted(v for v in set(policy.specific.versions) if v in available)
    n = policy.latest.num_versions or 1
    return available[-n:]


def poll_failure(name: str, err: InferpoolError) -> InferpoolError:
    """A load that failed while its model was read (directory, config, overrides), answered
    as Triton answers it: INTERNAL, "failed to load '<name>', failed to poll from model
    repository", then why."""
    return InferpoolError(
        Code.INTERNAL,
        f"failed to load '{name}', failed to poll from model repository: {err.message}",
    )


def scan_model(repository: str, name: str, auto_complete: bool = True) -> ModelEntry:
    """Read one model directory; errors are recorded on the entry, never raised.
    ``auto_complete``: whether a model may leave its config to be completed (load_config)."""
    path = os.path.join(repository, name)
    entry = ModelEntry(name=name, path=path)
    try:
        if not os.path.isdir(path):  # (the reason names no path: clients read it)
            raise InferpoolError(
                Code.NOT_FOUND, f"model '{name}' not found in any model repository"
            )
        entry.fingerprint = fingerprint(path)  # before reading: a later edit means reload
        entry.config = load_config(path, auto_complete)
        entry.versions = select_versions(entry.config, available_versions(path))
        if not entry.versions:
            raise InferpoolError(
                Code.INVALID_ARG,
                f"failed to load model '{name}': at least one version must be available under "
                f"the version policy of model '{name}'. Create a version directory such as "
                f"{os.path.join(path, '1')}/ (versions are positive integers)",
            )
    except InferpoolError as err:
        entry.error = err
    return entry


def scan(repository: str) -> dict[str, ModelEntry]:
    """Every model of the repository, as read from disk now."""
    return {name: scan_model(repository, name) for name in list_models(repository)}


def fingerprint(path: str) -> str:
    """A digest of every file under a model directory: its path, size and mtime (ns).

    What make and rsync compare, without reading model files that may be gigabytes.
    Dot-files (editor swap files) and ``__pycache__`` (written when model.py is imported)
    are left out, so serving a model does not make it look changed.
    """
    digest = hashlib.sha1()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        rel = os.path.relpath(root, path)
        digest.update(f"d {rel}\n".encode())
        for f in sorted(files):
            if f.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(os.path.join(root, f))
                digest.update(f"f {rel}/{f} {st.st_size} {st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
