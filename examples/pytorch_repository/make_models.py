"""Write the TorchScript models of this example repository (``<model>/1/model.pt``).

    python examples/pytorch_repository/make_models.py

``linear`` is a 4 -> 2 linear layer with fixed weights (torch.manual_seed(0)); ``accumulate``
is a stateful sequence model: each request adds its input to the running total of its
sequence, which the server keeps as implicit state between requests.  The files are a few KB;
they are committed so that ``inferpool serve --model-repository examples/pytorch_repository``
works without running this script.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

HERE = Path(__file__).resolve().parent


class Linear(nn.Module):
    """A linear layer of 4 features to 2, the same weights every time."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


class Accumulate(nn.Module):
    """OUTPUT__0 = STATE_IN__1 + INPUT__0; the new total is also the next state."""

    def forward(self, x: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        total = state + x
        return total, total


def main() -> None:
    """Write the example models as TorchScript."""
    for name, module in (("linear", Linear()), ("accumulate", Accumulate())):
        path = HERE / name / "1" / "model.pt"
        torch.jit.save(torch.jit.script(module.eval()), str(path))
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
