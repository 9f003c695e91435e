"""The labels of a model's outputs (``label_filename``), as Triton's core keeps them.

An output's ``label_filename`` names a file of the model's directory; each line is the
label of the class at that index (an empty line: that class has none).  The files are read
when the model loads: one that cannot be read, or that lies outside the model's directory,
fails the load with Triton's words.  An ensemble's output without labels of its own takes
those of the step output that writes it, once its composing models are ready.  The KServe
frontends ask for them (the ``model_labels`` message) to answer classification requests;
``serial`` changes whenever a version's labels may have, so they fetch them once per load.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.wire.ensemble_wiring import Wiring
from inferpool.wire.errors import Code, InferpoolError

_serials = itertools.count(1)


@dataclass(frozen=True)
class Labels:
    """Output name -> its labels, by class index; ``serial`` names this set."""

    by_output: Mapping[str, list[str]] = field(default_factory=dict)
    serial: int = field(default_factory=lambda: next(_serials))


def read_labels(config: pb.ModelConfig, model_dir: str) -> Labels:
    """The labels of every output of ``config`` with a ``label_filename``, read from
    ``model_dir``; InferpoolError as Triton fails such a load."""
    found: dict[str, list[str]] = {}
    root = os.path.realpath(model_dir)
    for output in config.output:
        if not output.label_filename:
            continue
        path = model_dir.rstrip("/") + "/" + output.label_filename  # Triton's JoinPath
        if os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise InferpoolError(
                Code.UNSUPPORTED,
                f"label file path '{path}' for output '{output.name}' in model "
                f"'{config.name}' is outside model directory",
            )
        try:
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except OSError as exc:
            raise InferpoolError(
                Code.INTERNAL,
                f"failed to open text file for read {path}: {exc.strerror or exc}",
            ) from None
        lines = text.split("\n")
        if lines[-1] == "":  # the newline that ends the last line starts no label
            lines.pop()
        found[output.name] = lines
    return Labels(found)


def inherit(own: Labels, wiring: Wiring, steps: Mapping[str, Labels], served: Labels) -> Labels:
    """An ensemble's labels: its own, and for each output without any, those of the step
    output that writes it (``steps``: each composing model's labels, by name); ``served``
    (what it serves now) when that is what they are."""
    found = dict(own.by_output)
    for step in wiring.steps:
        labels = steps.get(step.model_name)
        given = labels.by_output if labels is not None else {}
        for step_output, tensor in step.outputs.items():
            if tensor in wiring.outputs and tensor not in found and step_output in given:
                found[tensor] = given[step_output]
    return served if found == served.by_output else Labels(found)
