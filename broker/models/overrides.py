"""Explicit ``load`` with overrides, as Triton's load API has them.

``parameters: {"config": "<ModelConfig as JSON>"}`` loads the model from its repository
directory with that configuration instead of its config.pbtxt.  ``"file:<path>"``
parameters (each naming the tensor frame that carries the file's bytes) replace the model
directory altogether: the files are written into a directory of their own, with the
configuration as its config.pbtxt, and the model loads from there; a ``config`` is then
required.  The directory lives as long as the model loaded from it.  A later load without
overrides loads the repository's model again, and so does a reload (the override's
fingerprint never matches a directory's).  Errors use Triton's wording.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models import repository
from inferpool.broker.models.config import CONFIG_FILE, complete, validate
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

log = logging.getLogger("inferpool.overrides")
FILE_PREFIX = "file:"


@dataclass(frozen=True)
class Override:
    """What a load asked for instead of the repository's files."""

    config: str  # ModelConfig as JSON
    files: dict[str, bytes] = field(default_factory=dict)  # path in the model dir -> bytes

    def fingerprint(self) -> str:
        digest = hashlib.sha1(self.config.encode())
        for path, data in sorted(self.files.items()):
            digest.update(f"\0{path}\0{len(data)}\0".encode())
            digest.update(data)
        return "override:" + digest.hexdigest()


def _type_name(value: Any) -> str:
    """TRITONSERVER_ParameterTypeString of a JSON value."""
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT"
    if isinstance(value, float):
        return "DOUBLE"
    if isinstance(value, str):
        return "STRING"
    return "BYTES"


def parse(params: Any, frames: list[Any]) -> Override | None:
    """The override a load message's ``parameters`` ask for (None: load from the repository)."""
    if not params:
        return None
    if not isinstance(params, dict):
        raise invalid_arg("load 'parameters' must be an object")
    config: str | None = None
    files: dict[str, bytes] = {}
    for key, value in params.items():
        if key == "config":
            if not isinstance(value, str):
                raise invalid_arg("Config parameter 'config' must have string type for its value")
            config = value
        elif key.startswith(FILE_PREFIX):
            if type(value) is not int or not 0 <= value < len(frames):
                raise invalid_arg(
                    f"File parameter '{key}' must name the frame that carries the file's bytes "
                    f"(0 to {len(frames) - 1}), got {value!r}"
                )
            files[key[len(FILE_PREFIX) :]] = bytes(frames[value])
        else:
            raise invalid_arg(
                f"Unrecognized load parameter '{key}' with type '{_type_name(value)}'"
            )
    if config is None:
        if files:
            raise invalid_arg("Load parameter 'config' must be specified for model file override")
        return None
    return Override(config, files)


class Overrides:
    """The overrides in force, by model name, and the directories written for them."""

    def __init__(self, repository: str, auto_complete: bool = True) -> None:
        self.repository = repository
        self.auto_complete = auto_complete  # may a model's files leave its config unwritten
        self.wanted: dict[str, Override] = {}  # what the next build of a model loads
        self._base = ""  # made on first use, removed at close
        self._dirs: set[str] = set()

    def use(self, name: str, override: Override | None) -> None:
        """Loads of ``name`` use ``override`` from now on (None: the repository's files)."""
        if override is None:
            self.wanted.pop(name, None)
        else:
            self.wanted[name] = override

    def scan(self, name: str) -> repository.ModelEntry:
        """The model as the next load of it sees it: overridden, or as on disk."""
        override = self.wanted.get(name)
        if override is None:
            return repository.scan_model(self.repository, name, self.auto_complete)
        path = os.path.join(self.repository, name)
        entry = repository.ModelEntry(name=name, path=path, fingerprint=override.fingerprint())
        try:
            config = _parse_config(override.config)
            if override.files:
                entry.path = path = self._write(name, override.files)
            elif not os.path.isdir(path):
                raise InferpoolError(
                    Code.NOT_FOUND,
                    f"model '{name}' is not in the model repository: give its files as "
                    "file: parameters with its config",
                )
            complete(config, name, "config override", path)  # the backend from its files
            validate(config, name, "config override")
            if override.files:
                with open(os.path.join(path, CONFIG_FILE), "w", encoding="utf-8") as f:
                    f.write(text_format.MessageToString(config))
            entry.config = config
            entry.versions = repository.select_versions(config, repository.available_versions(path))
            if not entry.versions:
                raise invalid_arg(
                    f"failed to load model '{name}': at least one version must be available "
                    f"under the version policy of model '{name}'"
                )
        except InferpoolError as err:
            entry.error = err
            self.release(entry.path)
        return entry

    def _write(self, name: str, files: dict[str, bytes]) -> str:
        """A directory holding ``files`` (its config.pbtxt is written once completed)."""
        if not self._base:
            self._base = tempfile.mkdtemp(prefix="inferpool-overrides-")
        target = tempfile.mkdtemp(prefix=f"{name}-", dir=self._base)
        self._dirs.add(target)
        for rel, data in files.items():
            path = os.path.realpath(os.path.join(target, rel))
            if os.path.commonpath([path, target]) != target or path == target:
                self.release(target)
                raise invalid_arg(
                    f"Invalid file parameter '{FILE_PREFIX}{rel}' with normalized path "
                    f"'{path}' must stay within model directory."
                )
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            except OSError as exc:  # a path that is both a file and a directory
                self.release(target)
                raise invalid_arg(
                    f"Invalid file parameter '{FILE_PREFIX}{rel}': {exc.strerror}"
                ) from None
        return target

    def release(self, path: str) -> None:
        """Remove ``path`` if it is a directory written for an override."""
        if path in self._dirs:
            self._dirs.discard(path)
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        if self._base:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = ""
        self._dirs.clear()


def _parse_config(text: str) -> pb.ModelConfig:
    config = pb.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise invalid_arg(f"Invalid config override: {exc}") from None
    return config
