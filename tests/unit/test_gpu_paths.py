"""The GPU paths' logic where no GPU exists: a small cupy stand-in (``fake_cupy``) records
what the code asks of CUDA.  The same paths run for real in tests/gpu on a GPU machine
(``scripts/check_gpu.sh``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from inferpool.backends.api import InputTensor, Request, RequestedOutput, Response, copy_into
from inferpool.backends.testing import HeapMemory
from inferpool.client.shm_core import _device_view
from inferpool.shm import cuda
from inferpool.shm.refs import CUDA_IPC_HANDLE_SIZE, cuda_ref
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError
from inferpool.wire.worker.protocol import TensorRef
from inferpool.workers.memory import WorkerMemory, _open
from tests.unit.conftest import PythonModels
from tests.unit.fake_cupy import DeviceArray, FakeCupy

HANDLE = bytes(range(CUDA_IPC_HANDLE_SIZE))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCupy]:
    """A cupy stand-in whose IPC handles name 4096-byte allocations, in a process that sees
    every GPU by index (no ``CUDA_VISIBLE_DEVICES``); every mapping is closed by the end."""
    fake = FakeCupy()
    monkeypatch.setattr(cuda, "_cupy", lambda: fake)
    monkeypatch.setattr(cuda, "allocation_size", lambda ptr: 4096)
    monkeypatch.setattr(
        cuda, "_view", lambda _, ptr, n, owner, device: fake.array(np.zeros(n, np.uint8), device)
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    yield fake
    assert cuda._MAPPINGS == {}


# ---------------------------------------------------------------------------- opening regions
@pytest.mark.parametrize(
    ("visible", "gpu", "device"),
    [
        (None, "2", 2),  # a worker that sees every GPU (KIND_CPU, KIND_MODEL, python)
        ("2,3", "3", 1),  # ... under the server's CUDA_VISIBLE_DEVICES
        ("GPU-aa11", "GPU-aa11", 0),  # a GPU instance's worker, narrowed to the region's GPU
        ("3", "2", 5),  # narrowed to another GPU: its current device, with peer access
    ],
)
def test_a_region_opens_on_the_gpu_it_was_registered_on(
    fake: FakeCupy, monkeypatch: pytest.MonkeyPatch, visible, gpu, device
) -> None:
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    fake.current = 5
    region = _open(cuda_ref(7, 4096, HANDLE, gpu))
    assert isinstance(region, cuda.CudaRegion)
    assert (region.device, region.size) == (device, 4096)
    assert region.array(1024, 16).device == device  # arrays are tagged with that device
    assert fake.current == 5  # the worker's current device is left as it was
    region.close()
    assert fake.calls == [("open", device), ("close", device)]


def test_the_gpu_a_registration_names_is_found_in_each_processs_numbering() -> None:
    assert cuda.ordinal_of("3", None) == 3
    assert cuda.ordinal_of("GPU-aa11", None) is None  # a UUID needs CUDA_VISIBLE_DEVICES
    assert cuda.ordinal_of("GPU-bb22", "GPU-aa11, GPU-bb22") == 1
    assert cuda.ordinal_of("1", "0") is None


def test_a_handle_registered_twice_is_mapped_once(fake: FakeCupy) -> None:
    """Two registrations of one allocation (two names, two clients) share its mapping: CUDA
    opens a handle once per process."""
    first = _open(cuda_ref(7, 4096, HANDLE, "0"))
    second = _open(cuda_ref(8, 1024, HANDLE, "0"))
    assert isinstance(first, cuda.CudaRegion) and isinstance(second, cuda.CudaRegion)
    assert second.ptr == first.ptr and fake.calls == [("open", 0)]
    with pytest.raises(InferpoolError, match="byte_size 8192 exceeds the 4096 bytes"):
        _open(cuda_ref(9, 8192, HANDLE, "0"))  # refused without closing the others' mapping
    first.close()
    assert fake.calls == [("open", 0)]  # the second still reads through it
    assert second.array(0, 16).device == 0
    second.close()
    second.close()  # closing twice is harmless
    assert fake.calls == [("open", 0), ("close", 0)]
    third = _open(cuda_ref(10, 4096, HANDLE, "0"))  # mapped afresh once none uses it
    third.close()
    assert fake.calls == [("open", 0), ("close", 0)] * 2


def test_a_worker_lists_the_cuda_regions_it_opened_for_the_broker(
    fake: FakeCupy, memory: WorkerMemory
) -> None:
    """The broker waits, before it answers a CUDA unregister, only for the workers that
    said they opened the region."""
    ref = cuda_ref(7, 4096, HANDLE, "0")
    window = TensorRef("IN", "FP32", [4], ref, 0, 16)
    assert memory.batch_input(window, None).memory == "gpu"
    memory.batch_input(window, None)  # opened once
    memory.input_tensor(TensorRef("IN", "FP32", [4], memory.output.name, 0, 16), None)
    assert memory.take_opened() == [ref] and memory.take_opened() == []
    memory.unmap([ref])
    assert fake.calls == [("open", 0), ("close", 0)]


def test_a_registration_larger_than_its_allocation_is_refused_and_closed(fake: FakeCupy) -> None:
    with pytest.raises(InferpoolError) as info:
        _open(cuda_ref(7, 8192, HANDLE, "0"))
    assert info.value.code is Code.INVALID_ARG
    assert info.value.message == (
        "invalid CUDA shared-memory registration: byte_size 8192 exceeds the 4096 bytes of "
        "the CUDA allocation the handle names"
    )
    assert fake.calls == [("open", 0), ("close", 0)]  # nothing stays mapped


def test_the_broker_judges_cuda_support_without_importing_cupy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    found: Any = None
    monkeypatch.setattr(cuda.importlib.util, "find_spec", lambda name: found)
    assert cuda.support_reason(1) == (
        "cupy is not installed (pip install 'inferpool[gpu]' (CUDA 12) or 'inferpool[gpu-cuda13]')"
    )
    found = object()
    assert cuda.support_reason(0) == "no GPU is visible to the server"
    assert cuda.support_reason(2) is None
    assert "cupy" not in sys.modules


# ---------------------------------------------------------------------------- replying
class CudaWindow:
    """OutputMemory that places outputs in a client's CUDA region (device 0)."""

    def __init__(self, fake: FakeCupy) -> None:
        self.fake = fake
        self.released: list[int] = []
        self.placed: list[DeviceArray] = []

    def allocate(self, output: RequestedOutput | None, nbytes: int) -> tuple[str, int, Any]:
        self.placed.append(self.fake.array(np.zeros(nbytes, np.uint8)))
        return "cuda/1/4096/00", 0, self.placed[-1]

    def release(self, region: str, offset: int) -> None:
        self.released.append(offset)

    def slot_views(self, region: str) -> None:
        return None  # a client's region: no views kept


def request(memory: Any, replies: list[Any]) -> Request:
    def emit(request: Request, response: Response | None, final: bool) -> None:
        replies.append(("reply", response))

    return Request(
        id="1",
        inputs={},
        requested_outputs={"OUT": RequestedOutput("OUT", target=["cuda/1/4096/00", 0, 4096])},
        memory=memory,
        emit=emit,
    )


def test_outputs_written_on_the_gpu_are_waited_for_before_the_reply(fake: FakeCupy) -> None:
    req = request(CudaWindow(fake), fake.calls)
    response = req.response()
    copy_into(response.output("OUT", [4], "FP32"), fake.array(np.arange(4, dtype=np.float32)))
    req.respond(response)
    assert fake.calls == [("device copy", 0), ("synchronize", 0), ("reply", response)]


def test_bytes_outputs_are_serialized_on_the_host_into_a_cuda_region(fake: FakeCupy) -> None:
    """As Triton's backends write strings: serialized, copied to the device, waited for."""
    memory = CudaWindow(fake)
    req = request(memory, fake.calls)
    response = req.response()
    words = np.array([b"ab", b"", "é".encode()], dtype=object)
    response.set_output("OUT", words, "BYTES")
    req.respond(response)
    assert fake.calls == [("set", 0), ("synchronize", 0), ("reply", response)]
    assert response.error is None and response.outputs["OUT"].byte_size == 16
    [placed] = memory.placed
    assert placed.get().tobytes() == codec.serialize_bytes(words)
    client_buffer = SimpleNamespace(array=lambda offset, nbytes: placed)
    spec = {"name": "OUT", "datatype": "BYTES", "shape": [3]}
    read = _device_view(client_buffer, 0, 16, spec)  # what the client gets back
    assert read.tolist() == words.tolist()


def test_bytes_inputs_in_a_cuda_region_reach_a_model_as_strings(
    fake: FakeCupy, memory: WorkerMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    payload = codec.serialize_bytes(np.array([b"ab", b"c"], dtype=object))
    device = fake.array(np.frombuffer(payload, np.uint8).copy())
    monkeypatch.setattr(cuda.CudaRegion, "array", lambda self, offset, nbytes: device)
    ref = cuda_ref(7, 4096, HANDLE, "0")
    given = memory.batch_input(TensorRef("IN", "BYTES", [2, 1], ref, 0, len(payload)), (2,))
    assert (given.memory, given.shape, given.data.tolist()) == ("cpu", (2,), [b"ab", b"c"])
    assert fake.calls == [("open", 0), ("get", 0)]
    memory.unmap([ref])


def test_host_outputs_are_replied_without_waiting_for_a_gpu(fake: FakeCupy) -> None:
    req = request(HeapMemory(), fake.calls)
    response = req.response()
    response.set_output("OUT", fake.array(np.arange(4, dtype=np.float32)))
    req.respond(response)
    assert fake.calls == [("get", 0), ("reply", response)]  # the copy to the host blocks


def test_a_failed_gpu_write_answers_with_its_error_and_frees_the_output(fake: FakeCupy) -> None:
    fake.fail_sync = True
    memory = CudaWindow(fake)
    req = request(memory, fake.calls)
    response = req.response()
    response.output("OUT", [4], "FP32")
    req.respond(response)
    (_, sent) = fake.calls[-1]
    assert sent.error.code is Code.INTERNAL
    assert "writing outputs on the GPU failed: cudaErrorIllegalAddress" in sent.error.message
    assert memory.released == [0]


# ---------------------------------------------------------------------------- device arrays
def test_device_arrays_are_copied_by_their_library_never_through_numpy(fake: FakeCupy) -> None:
    values = np.arange(6, dtype=np.int32).reshape(2, 3)
    device = fake.array(values.copy())
    assert codec.device_of(device) == 0 and codec.device_of(values) is None
    np.testing.assert_array_equal(codec.as_array(device), values)  # a client's frame input
    host = np.zeros((2, 3), np.int32)
    copy_into(host, device)  # GPU input -> host arena
    np.testing.assert_array_equal(host, values)
    target = fake.array(np.zeros((2, 3), np.int32))
    copy_into(target, values)  # host -> client's CUDA region
    assert fake.calls == [("get", 0), ("get", 0), ("set", 0)]
    assert codec.datatype_of(device.dtype) == "INT32"


def test_device_arrays_become_tensors_through_dlpack(
    fake: FakeCupy, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from inferpool.backends.pytorch import dtypes

    taken: list[Any] = []

    def from_dlpack(a: Any) -> Any:
        taken.append(a)
        return torch.zeros(1)

    monkeypatch.setattr(torch, "from_dlpack", from_dlpack)
    device = fake.array(np.zeros(4, np.float32))  # has no flags.writeable: numpy's attribute
    dtypes.as_tensor(device)
    assert taken == [device]
    assert codec.datatype_of(torch.bfloat16) == "BF16"


# ---------------------------------------------------------------------------- python backend
GPU_AWARE_MODEL = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.device = args["model_instance_device_id"]

    def execute(self, requests):
        responses = []
        for r in requests:
            t = pb_utils.get_input_tensor_by_name(r, "IN")
            outputs = [pb_utils.Tensor("OUT", t.as_numpy() + 1)] if t.is_cpu() else []
            parameters = {"is_cpu": t.is_cpu(), "device": self.device}
            responses.append(pb_utils.InferenceResponse(outputs, parameters=parameters))
        return responses
"""
GPU_INSTANCE = {"name": "m_0_0", "kind": "GPU", "device_id": 3, "cuda_ordinal": 0}


def gpu_request(h: Any, fake: FakeCupy) -> Request:
    req = h.request({"IN": np.zeros(3, np.int32)})
    data = fake.array(np.array([1, 2, 3], np.int32))
    req.inputs["IN"] = InputTensor("IN", "INT32", (3,), data, 12, "gpu", 0)
    return req


def run(h: Any, req: Request) -> Response:
    [(_, response, _)] = h.execute([req])
    assert response is not None and response.error is None, response
    return response


def test_python_models_get_gpu_inputs_on_the_cpu_by_default(
    models: PythonModels, fake: FakeCupy
) -> None:
    model_dir = models.make("m", models.io_config(), {"1/model.py": GPU_AWARE_MODEL})
    with models.load(model_dir, instance=GPU_INSTANCE) as h:
        response = run(h, gpu_request(h, fake))
        assert response.parameters == {"is_cpu": True, "device": "0"}  # the CUDA ordinal
        np.testing.assert_array_equal(h.outputs_of(response)["OUT"], [2, 3, 4])
    assert fake.calls == [("get", 0)]


def test_force_cpu_only_input_tensors_no_leaves_them_on_the_gpu(
    models: PythonModels, fake: FakeCupy
) -> None:
    extra = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }'
    model_dir = models.make("m", models.io_config(extra), {"1/model.py": GPU_AWARE_MODEL})
    with models.load(model_dir, instance=GPU_INSTANCE) as h:
        assert run(h, gpu_request(h, fake)).parameters["is_cpu"] is False
    assert fake.calls == []


def test_force_cpu_only_input_tensors_takes_yes_or_no(models: PythonModels) -> None:
    extra = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "on" } }'
    model_dir = models.make("m", models.io_config(extra), {"1/model.py": GPU_AWARE_MODEL})
    err = models.load_error(model_dir)
    assert err.code is Code.UNSUPPORTED
    assert "Incorrect value for FORCE_CPU_ONLY_INPUT_TENSORS: 'on'" in err.message


def test_fake_device_arrays_refuse_numpy(fake: FakeCupy) -> None:
    """The stand-in fails where cupy fails, so the tests above prove numpy was not used."""
    device: DeviceArray = fake.array(np.zeros(2))
    with pytest.raises(TypeError):
        np.asarray(device)
    with pytest.raises(BufferError):
        np.from_dlpack(device)
    with pytest.raises(AttributeError):
        device.flags  # type: ignore[attr-defined]  # noqa: B018
