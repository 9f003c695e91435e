"""Small real TorchScript models for the pytorch backend tests, saved into a model repository."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn


class Linear(nn.Module):
    def __init__(self, n_in: int = 4, n_out: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(n_in, n_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x)


class FollowsItsWeights(nn.Module):
    """A KIND_MODEL model: it moves its input to wherever its weights are."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(x.to(self.linear.weight.device))


class AddSub(nn.Module):
    """Two inputs, two outputs: (a + b, a - b)."""

    def forward(self, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        return a + b, a - b


class GrowsItsInput(nn.Module):
    """Changes its input's shape in place (``unsqueeze_``) and answers twice its values."""

    def forward(self, x: Tensor) -> Tensor:
        x.unsqueeze_(0)
        return x[0] * 2


class DictInput(nn.Module):
    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        return inputs["x"] * 2 + inputs["y"]


class Upper(nn.Module):
    """List[str] in; List[str] out, and each word's length as a tensor."""

    def forward(self, words: list[str]) -> tuple[list[str], Tensor]:
        lengths = torch.tensor([len(w) for w in words], dtype=torch.int64)
        return [w.upper() for w in words], lengths.reshape(-1, 1)


class Accumulate(nn.Module):
    """A sequence model: the state accumulates x; the controls are echoed back as floats."""

    def forward(
        self, x: Tensor, start: Tensor, end: Tensor, ready: Tensor, corrid: Tensor, state: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        total = state + x
        controls = torch.cat([start.float(), end.float(), ready.float(), corrid.float()], dim=-1)
        return total, controls, total


def save(
    module: nn.Module | torch.jit.ScriptModule, repo: Path, filename: str = "model.pt"
) -> Path:
    """Script (if needed) and save ``module`` as ``<repo>/1/<filename>``."""
    scripted = module if isinstance(module, torch.jit.ScriptModule) else torch.jit.script(module)
    path = repo / "1" / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(scripted, str(path))
    return path


def io(kind: str, name: str, data_type: str, dims: list[int], extra: str = "") -> str:
    return f'{kind} {{ name: "{name}" data_type: {data_type} dims: {dims} {extra} }}'


def config(
    inputs: list[str],
    outputs: list[str],
    *,
    max_batch_size: int = 0,
    extra: str = "",
    name: str = "m",
) -> str:
    header = [f'name: "{name}"', 'backend: "pytorch"', f"max_batch_size: {max_batch_size}"]
    return "\n".join([*header, *inputs, *outputs, extra])


def inp(name: str, data_type: str, dims: list[int], extra: str = "") -> str:
    return io("input", name, data_type, dims, extra)


def out(name: str, data_type: str, dims: list[int], extra: str = "") -> str:
    return io("output", name, data_type, dims, extra)


#: the config of ``DictInput``: inputs x and y (INT64, [3]), batched
DICT_INPUT = config(
    [inp("x", "TYPE_INT64", [3]), inp("y", "TYPE_INT64", [3])],
    [out("OUTPUT__0", "TYPE_INT64", [3])],
    max_batch_size=4,
)

SEQUENCE_CONTROLS = """
  control_input [
    { name: "START__1" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
    { name: "END__2" control [{ kind: CONTROL_SEQUENCE_END fp32_false_true: [0, 1] }] },
    { name: "READY__3" control [{ kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true] }] },
    { name: "CORRID__4" control [{ kind: CONTROL_SEQUENCE_CORRID data_type: %s }] }
  ]
"""
SEQUENCE_STATE = """
  state [{ input_name: "STATE_IN__5" output_name: "STATE_OUT__2" data_type: TYPE_FP32 dims: [1] }]
"""


def accumulate_config(
    max_batch_size: int = 0,
    corrid: str = "TYPE_INT64",
    state: str = SEQUENCE_STATE,
    *,
    name: str = "m",
    extra: str = "",
) -> str:
    """The config of ``Accumulate``: controls START__1..CORRID__4, state STATE_IN__5/_OUT__2."""
    return config(
        [inp("INPUT__0", "TYPE_FP32", [1])],
        [out("OUTPUT__0", "TYPE_FP32", [1]), out("CONTROLS__1", "TYPE_FP32", [4])],
        max_batch_size=max_batch_size,
        extra="sequence_batching {" + SEQUENCE_CONTROLS % corrid + state + extra + "}",
        name=name,
    )


class RaggedBatch(nn.Module):
    """The ragged-batch model of ``tests.ragged_batches``, as TorchScript: each batch input
    comes back whole on every row of the batch (as many as ITEMS has)."""

    def forward(
        self,
        RAGGED: Tensor,
        ITEMS: Tensor,
        COUNT: Tensor,
        ACC: Tensor,
        ACC0: Tensor,
        MAXS: Tensor,
        FLAT: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        rows = ITEMS.shape[0]
        return (
            RAGGED * 2,
            ITEMS,
            self.whole(COUNT, rows),
            self.whole(ACC, rows),
            self.whole(ACC0, rows),
            self.whole(MAXS, rows),
            self.whole(FLAT, rows),
        )

    def whole(self, x: Tensor, rows: int) -> Tensor:
        return x.float().reshape(1, -1).expand(rows, -1).contiguous()
