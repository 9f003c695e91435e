"""The models ``bench_models.py`` serves, built from torch.nn with random weights (no download).

* ``resnet``: ResNet-50's layout (a 7x7 stem, bottleneck stages of 3, 4, 6 and 3 blocks, 1000
  classes) on 224x224 images;
* ``bert``: BERT-base's layout (12 encoder layers, hidden 768, 12 heads, FFN 3072, a
  30522-token vocabulary) on 128 tokens.

``quick`` keeps each layout and its input shape but narrows it, so that a 2-core run takes
minutes: the ResNet's channels are a quarter as wide (about 1/16 of the work), the encoder's
hidden size is 128 (2 heads, FFN 512; its output is 128 x 128 in place of 128 x 768).
:func:`export` writes ``model.onnx`` (the onnxruntime and openvino backends) and ``model.pt``
(TorchScript, the pytorch backend).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from runtime_floor import InputSpec
from torch import nn

SEQ = 128
VOCAB = 30522
MODELS = ("resnet", "bert")


@dataclass(frozen=True)
class ModelSpec:
    """A model as the bench serves it: how to build it, its input and its output's config."""

    name: str
    input: InputSpec
    output_type: str  # the config's data_type and dims of OUTPUT__0
    width: int  # ResNet: the stem's channels; BERT: the hidden size

    @property
    def input_type(self) -> str:
        dims = ", ".join(map(str, self.input.dims))
        return f"{self.input.config_type} dims: [ {dims} ]"

    def build(self) -> nn.Module:
        if self.name == "resnet":
            return resnet50(self.width)
        return Bert(self.width).eval()


def spec(name: str, quick: bool) -> ModelSpec:
    """Model ``name`` (``resnet`` or ``bert``), full size or ``quick``."""
    if name == "resnet":
        image = InputSpec("float32", (3, 224, 224), 0)
        return ModelSpec(name, image, "TYPE_FP32 dims: [ 1000 ]", 16 if quick else 64)
    if name == "bert":
        hidden = 128 if quick else 768
        tokens = InputSpec("int64", (SEQ,), VOCAB)
        return ModelSpec(name, tokens, f"TYPE_FP32 dims: [ {SEQ}, {hidden} ]", hidden)
    raise SystemExit(f"unknown model '{name}': choose resnet or bert")


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )  # fmt: skip
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.skip(x))


def resnet50(width: int = 64) -> nn.Module:
    """ResNet-50's layout with a stem of ``width`` channels (64: ResNet-50 itself)."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]  # fmt: skip
    cin = width
    for scale, blocks, stride in ((1, 3, 1), (2, 4, 2), (4, 6, 2), (8, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width * scale, stride if i == 0 else 1))
            cin = width * scale * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers).eval()


class Bert(nn.Module):
    """BERT-base's layout at hidden size ``hidden`` (768: BERT-base itself; a head per 64)."""

    def __init__(self, hidden: int = 768) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, hidden)
        self.positions = nn.Parameter(torch.randn(1, SEQ, hidden) * 0.02)
        layer = nn.TransformerEncoderLayer(
            hidden, hidden // 64, hidden * 4, batch_first=True, activation="gelu"
        )
        self.encoder = nn.TransformerEncoder(layer, 12, enable_nested_tensor=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(self.tokens(ids) + self.positions)


def export(model: ModelSpec, folder: Path) -> tuple[Path, Path]:
    """``model.onnx`` and ``model.pt`` of ``model`` in ``folder``, batch dimension variable."""
    module = model.build()
    x = torch.from_numpy(model.input.make(2))
    onnx_path, pt_path = folder / "model.onnx", folder / "model.pt"
    # the encoder's fused fast path has no ONNX export: trace the plain layers
    torch.backends.mha.set_fastpath_enabled(False)
    with torch.no_grad():
        torch.onnx.export(
            module, (x,), str(onnx_path), input_names=["INPUT__0"], output_names=["OUTPUT__0"],
            dynamic_axes={"INPUT__0": {0: "batch"}, "OUTPUT__0": {0: "batch"}}, dynamo=False,
        )  # fmt: skip
        torch.jit.trace(module, (x,)).save(str(pt_path))
    return onnx_path, pt_path
