"""Instance kinds: KIND_CPU (elsewhere), KIND_MODEL, and KIND_GPU where CUDA exists.

The backend runs in this process here (no ``CUDA_VISIBLE_DEVICES``), so an instance's
CUDA ordinal is its device id; tests/gpu serves them from narrowed workers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
import torch_models as tm

from inferpool.backends.api import InputTensor
from inferpool.backends.pytorch.device import Placement
from inferpool.wire.errors import Code, InferpoolError
from tests.gpu.paths import PYTORCH_KIND_MODEL, PYTORCH_LAST_GPU, path

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch.cuda.is_available() is false on this machine"
)

CONFIG = tm.config(
    [tm.inp("INPUT__0", "TYPE_FP32", [4])],
    [tm.out("OUTPUT__0", "TYPE_FP32", [2])],
    max_batch_size=8,
)


def expected(x: np.ndarray) -> np.ndarray:
    return tm.Linear()(torch.from_numpy(x)).detach().numpy()


def instance(kind: str, device_id: int = 0, **more: object) -> dict[str, object]:
    return {"name": "m_0_0", "kind": kind, "device_id": device_id, **more}


def test_kind_model_runs_where_the_model_put_itself(repo, harness):
    tm.save(tm.Linear(), repo)
    h = harness(CONFIG, instance=instance("MODEL"))
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(h.infer({"INPUT__0": x})["OUTPUT__0"], expected(x), rtol=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a CUDA-less machine")
def test_kind_gpu_without_cuda_is_unavailable(repo, harness):
    tm.save(tm.Linear(), repo)
    with pytest.raises(InferpoolError) as info:  # the worker of GPU 3 sees it as its device 0
        harness(CONFIG, instance=instance("GPU", 3, cuda_ordinal=0))
    assert info.value.code is Code.UNAVAILABLE
    assert (
        "instance 'm_0_0' is KIND_GPU on device 3 (CUDA device 0 of its worker), but torch "
        "sees 0 CUDA device(s) (torch.cuda.is_available() is False)"
    ) in info.value.message


@path(PYTORCH_LAST_GPU)
@needs_cuda
@pytest.mark.parametrize("cache_cleaning", ["false", "true"])
def test_kind_gpu_loads_on_its_device_and_times_with_events(repo, harness, cache_cleaning):
    tm.save(tm.Linear(), repo)
    config = CONFIG + (
        '\nparameters { key: "ENABLE_CACHE_CLEANING" '
        f'value: {{ string_value: "{cache_cleaning}" }} }}'
    )
    device_id = torch.cuda.device_count() - 1
    h = harness(config, instance=instance("GPU", device_id))
    module = h.host.instance.artifact.module
    assert {p.device for p in module.parameters()} == {torch.device("cuda", device_id)}
    x = np.random.default_rng(0).random((3, 4), dtype=np.float32)
    requests = [h.request({"INPUT__0": x[:1]}), h.request({"INPUT__0": x[1:]})]
    results = [h.outputs_of(r)["OUTPUT__0"] for _, r, _ in h.execute(requests)]
    np.testing.assert_allclose(np.concatenate(results), expected(x), rtol=1e-5, atol=1e-6)
    stamps = h.host.timing_of(requests[0]).stamps
    assert stamps.exec_start <= stamps.compute_start <= stamps.compute_end


@path(PYTORCH_KIND_MODEL)
@needs_cuda
def test_kind_model_with_cuda_uses_a_stream_per_device(repo, harness):
    tm.save(tm.FollowsItsWeights().to(f"cuda:{torch.cuda.device_count() - 1}"), repo)
    h = harness(CONFIG, instance=instance("MODEL"))
    assert len(h.host.instance.placement.streams) == torch.cuda.device_count()
    x = np.ones((2, 4), np.float32)
    np.testing.assert_allclose(
        h.infer({"INPUT__0": x})["OUTPUT__0"], expected(x), rtol=1e-5, atol=1e-6
    )
    assert torch.cuda.current_device() == 0


class Stream:
    def __init__(self, device: int) -> None:
        self.device = torch.device("cuda", device)


class FakeCuda:
    """torch.cuda's current device and streams, as its C++ side keeps them: setting a
    stream makes its device current (``THCPModule_setStream_wrap``)."""

    def __init__(self, count: int) -> None:
        self.device = 0
        self.defaults = [Stream(d) for d in range(count)]
        self.current = list(self.defaults)

    def set_stream(self, stream: Stream) -> None:
        self.device = stream.device.index
        self.current[self.device] = stream

    def current_stream(self, device: torch.device) -> Stream:
        return self.current[device.index]

    def set_device(self, device: int | torch.device) -> None:
        self.device = device.index if isinstance(device, torch.device) else device


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    fake = FakeCuda(3)
    for name in ("set_stream", "current_stream", "set_device"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: fake.device)
    yield fake


@pytest.mark.parametrize(("kind", "devices"), [("MODEL", (0, 1, 2)), ("GPU", (1,))])
def test_setting_the_streams_leaves_the_instances_device_current(fake_cuda, kind, devices):
    placement = Placement("CPU", 0, 0, "m_0_0")  # given the streams of a CUDA machine by hand
    placement.kind, placement.streams = kind, [Stream(d) for d in devices]  # type: ignore[misc]
    placement.device = torch.device("cuda", devices[0]) if kind == "GPU" else None
    entered: list[str] = []
    with placement.around(contextlib.nullcontext(entered)) as inner:
        inner.append("settings")  # the execution's settings apply inside the streams' scope
        # KIND_GPU on its own device; KIND_MODEL where it was, not on the last stream's
        assert fake_cuda.device == (devices[0] if kind == "GPU" else 0)
        assert [fake_cuda.current[d] for d in devices] == placement.streams
    assert fake_cuda.device == 0
    assert fake_cuda.current == fake_cuda.defaults
    assert entered == ["settings"]


class Event:
    """A CUDA event that logs its recording and tells elapsed times 2 ms apart per index."""

    def __init__(self, index: int, log: list[int]) -> None:
        self.index, self.log = index, log

    def record(self, stream: object) -> None:
        self.log.append(self.index)

    def elapsed_time(self, end: Event) -> float:
        return 2.0 * (end.index - self.index)


class TimedStream(Stream):
    def synchronize(self) -> None:
        pass


def test_cuda_events_time_a_gpu_execution(repo, harness, fake_cuda):
    tm.save(tm.Linear(), repo)
    h = harness(CONFIG)  # a CPU instance given a GPU's stream and events by hand
    placement = h.host.instance.placement
    recorded: list[int] = []
    placement.kind, placement.streams = "GPU", [TimedStream(0)]
    placement.events = [Event(i, recorded) for i in range(3)]
    x = np.ones((2, 4), np.float32)
    request = h.request({"INPUT__0": x})
    [(_, response, _)] = h.execute([request])
    np.testing.assert_allclose(h.outputs_of(response)["OUTPUT__0"], expected(x), rtol=1e-6)
    assert recorded == [0, 1, 2]
    stamps = h.host.timing_of(request).stamps  # input and infer time as the events tell
    assert stamps.compute_start - stamps.exec_start == 2_000_000
    assert stamps.compute_end - stamps.compute_start == 2_000_000
    recorded.clear()  # a batch that fails before its output is timed by the wall clock
    request = h.request({"INPUT__0": np.ones((2, 4), np.float32)}, ["OUTPUT__0"])
    h.host.instance.forward = lambda *args: 1 / 0
    [(_, response, _)] = h.execute([request])
    assert response.error is not None and "PyTorch execute failure" in response.error.message
    assert recorded == [0, 1]
    stamps = h.host.timing_of(request).stamps
    assert stamps.exec_start <= stamps.compute_start <= stamps.compute_end <= stamps.exec_end


class OnGpu(torch.Tensor):
    """A tensor that says it lives on cuda:0, as an input in a client's CUDA region reaches
    the backend (``torch.from_dlpack`` of a cupy array); its values lie on the CPU.  Every
    copy made of it is recorded with whether it was queued (``non_blocking``)."""

    copies: ClassVar[list[bool]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == torch.Tensor.device.__get__:  # a new method-wrapper each time
            return torch.device("cuda", 0)
        if func in (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.copy_):
            cls.copies.append(bool(kwargs.get("non_blocking", False)))
        if func in (torch.Tensor.to, torch.Tensor.cpu):  # what a copy to the CPU gives
            with torch._C.DisableTorchFunctionSubclass():
                return args[0].clone()
        return super().__torch_function__(func, types, args, kwargs)


def on_one_device(forward: Any) -> Any:
    """``forward`` refusing tensors that are not on the CPU, as a model with CPU weights
    does."""

    def checked(*args: Any) -> Any:
        for arg in args:
            if arg.device.type != "cpu":
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two "
                    f"devices, {arg.device} and cpu!"
                )
        return forward(*args)

    return checked


@pytest.mark.parametrize("kind", ["CPU", "MODEL"])
@pytest.mark.parametrize("count", [1, 2])
def test_gpu_inputs_reach_a_cpu_side_instance_on_the_cpu(repo, harness, kind, count):
    """An input in a client's CUDA region, sent to a KIND_CPU or KIND_MODEL instance (whose
    inputs are gathered on the CPU), is copied to the CPU, blocking, alone or in a batch."""
    tm.save(tm.Linear(), repo)
    h = harness(CONFIG, instance=instance(kind))
    instance_ = h.host.instance
    instance_.forward = on_one_device(instance_.forward)
    x = np.random.default_rng(count).random((count, 4), dtype=np.float32)
    requests = []
    for row in x:
        request = h.request({"INPUT__0": row[None]})
        data = torch.from_numpy(row[None].copy()).as_subclass(OnGpu)
        request.inputs["INPUT__0"] = InputTensor("INPUT__0", "FP32", (1, 4), data, 16, "gpu")
        requests.append(request)
    OnGpu.copies.clear()
    results = []
    for _, response, _ in h.execute(requests):
        assert response is not None and response.error is None, response
        results.append(h.outputs_of(response)["OUTPUT__0"])
    np.testing.assert_allclose(np.concatenate(results), expected(x), rtol=1e-5, atol=1e-6)
    assert OnGpu.copies and not any(OnGpu.copies)  # copied, and each copy blocked
