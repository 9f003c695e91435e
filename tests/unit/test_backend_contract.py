"""The backend contract, through the real host, with custom backends written into tmp_path.

Each backend is found where Triton would look (version dir, model dir, --backend-directory,
built-in); the tests check the lifecycle order, what a failing hook or execute does, the
search order and its error, decoupled streams and unanswered requests.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from inferpool.backends import loader
from inferpool.backends.api import Request
from inferpool.backends.testing import BackendHarness, HeapMemory
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError

# A backend that records every hook into RECORD, fails in the hook named FAIL_IN, and tags
# its responses with WHERE (which copy of it the search found).
RECORDER = """
from pathlib import Path

import numpy as np

from inferpool.backends.api import Backend, Model, ModelInstance, Response
from inferpool.wire.errors import invalid_arg

RECORD = Path({record!r})
FAIL_IN = {fail_in!r}
WHERE = {where!r}


def hook(name):
    with RECORD.open("a") as f:
        f.write(name + "\\n")
    if name == FAIL_IN:
        raise RuntimeError(name + " exploded")


class RecorderModel(Model):
    def initialize(self):
        hook("model.initialize")

    def finalize(self):
        hook("model.finalize")


class RecorderInstance(ModelInstance):
    def initialize(self):
        hook("instance.initialize")

    def execute(self, requests):
        hook("instance.execute %d" % len(requests))
        responses = []
        for request in requests:
            src = request.input("IN")
            first = int(src.data.reshape(-1)[0])
            if first < 0:
                raise RuntimeError("negative input %d" % first)
            if first == 0:
                responses.append(Response.from_error(request, invalid_arg("zero is not allowed")))
                continue
            response = request.response()
            np.copyto(response.output("OUT", src.shape, src.datatype), src.data)
            response.set_parameter("where", WHERE)
            responses.append(response)
        return responses

    def finalize(self):
        hook("instance.finalize")


class RecorderBackend(Backend):
    model_class = RecorderModel
    instance_class = RecorderInstance

    def initialize(self):
        hook("backend.initialize")

    def finalize(self):
        hook("backend.finalize")


BACKEND = RecorderBackend
"""

# Identity-style decoupled backend: N copies of IN (N = IN[0]), then the final flag, sent
# alone (as Triton's triton_final_response) or with the last copy (parameter "final_with_last").
STREAMER = """
import numpy as np

from inferpool.backends.api import Backend, Model, ModelInstance


class StreamerInstance(ModelInstance):
    def execute(self, requests):
        for request in requests:
            sender = request.response_sender()
            src = request.input("IN")
            count = int(src.data[0])
            with_last = bool(request.parameters.get("final_with_last"))
            for i in range(count):
                response = request.response()
                np.copyto(response.output("OUT", src.shape, src.datatype), src.data)
                sender.send(response, final=with_last and i == count - 1)
            if not (with_last and count):
                sender.send(None, final=True)
        return None


class StreamerBackend(Backend):
    model_class = Model
    instance_class = StreamerInstance


BACKEND = StreamerBackend
"""

# A backend that forgets to answer.
LAZY = """
from inferpool.backends.api import Backend, Model, ModelInstance


class LazyInstance(ModelInstance):
    def execute(self, requests):
        return None


class LazyBackend(Backend):
    model_class = Model
    instance_class = LazyInstance


BACKEND = LazyBackend
"""

LIFECYCLE = [
    "backend.initialize",
    "model.initialize",
    "instance.initialize",
    "instance.execute 1",
    "instance.finalize",
    "model.finalize",
    "backend.finalize",
]


def config(backend: str, extra: str = "") -> str:
    return textwrap.dedent(f"""
    name: "m"
    backend: "{backend}"
    {extra}
    input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]
    """)


class Layout:
    """A model repository in tmp_path and the places a backend can be put for it."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.model_dir = tmp_path / "models" / "m"
        (self.model_dir / "1").mkdir(parents=True)
        self.backend_directory = tmp_path / "backends"
        self.record = tmp_path / "calls.txt"
        self._monkeypatch = monkeypatch

    def path(self, where: str, name: str) -> Path:
        return {
            "version": self.model_dir / "1" / f"{name}.py",
            "version-package": self.model_dir / "1" / name / "__init__.py",
            "model": self.model_dir / f"{name}.py",
            "backend-directory": self.backend_directory / name / f"{name}.py",
            "backend-directory-package": self.backend_directory / name / "__init__.py",
            "builtin": self.backend_directory.parent / "builtin" / f"{name}.py",
        }[where]

    def install(self, where: str, name: str, source: str) -> Path:
        path = self.path(where, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        if where == "builtin":  # shipped as inferpool.backends.<name>, as identity and python are
            spec = importlib.util.spec_from_file_location(f"inferpool.backends.{name}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._monkeypatch.setitem(sys.modules, f"inferpool.backends.{name}", module)
            self._monkeypatch.setattr(loader, "BUILTIN", (*loader.BUILTIN, name))
        return path

    def install_recorder(self, where: str, fail_in: str = "", name: str = "recorder") -> Path:
        source = RECORDER.format(record=str(self.record), fail_in=fail_in, where=where)
        return self.install(where, name, source)

    def harness(self, backend: str = "recorder", extra: str = "") -> BackendHarness:
        return BackendHarness(
            backend,
            config(backend, extra),
            repository_path=str(self.model_dir),
            backend_directory=str(self.backend_directory),
        )

    def load_error(self, backend: str = "recorder") -> InferpoolError:
        with pytest.raises(InferpoolError) as info:
            self.harness(backend)
        return info.value

    def calls(self) -> list[str]:
        return self.record.read_text().splitlines()


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Layout:
    return Layout(tmp_path, monkeypatch)


WHERES = [
    "version",
    "version-package",
    "model",
    "backend-directory",
    "backend-directory-package",
    "builtin",
]


@pytest.mark.parametrize("where", WHERES)
def test_each_hook_runs_once_in_order_wherever_the_backend_is_found(
    layout: Layout, where: str
) -> None:
    layout.install_recorder(where)
    with layout.harness() as h:
        [(_, response, final)] = h.execute([h.request({"IN": [1, 2, 3]})])
        assert final and response is not None
        assert h.outputs_of(response)["OUT"].tolist() == [1, 2, 3]
        assert response.parameters["where"] == where
    assert layout.calls() == LIFECYCLE


def test_search_order_version_model_backend_directory_builtin(layout: Layout) -> None:
    order = ["version", "model", "backend-directory", "builtin"]
    paths = [layout.install_recorder(where) for where in order]
    for where, path in zip(order, paths, strict=True):
        with layout.harness() as h:
            [(_, response, _)] = h.execute([h.request({"IN": [1]})])
            assert response is not None and response.parameters["where"] == where
        path.unlink()  # the next place is searched once this one is gone


def test_missing_backend_names_every_place_searched(layout: Layout) -> None:
    err = layout.load_error("nosuch")
    m, b = layout.model_dir, layout.backend_directory
    assert err.code == Code.NOT_FOUND
    assert err.message == (
        "failed to load model 'm' version 1: unable to find backend 'nosuch'; searched: "
        f"{m}/1/libtriton_nosuch.so; {m}/1/nosuch.py; {m}/1/nosuch/__init__.py; "
        f"{m}/libtriton_nosuch.so; {m}/nosuch.py; {m}/nosuch/__init__.py; "
        f"{b}/nosuch/libtriton_nosuch.so; {b}/nosuch/__init__.py; {b}/nosuch/nosuch.py; "
        f"{b}/nosuch/nosuch/__init__.py; "
        "built-in backends (identity, python, pytorch, onnxruntime, openvino); "
        "entry points of group 'inferpool.backends'"
    )


@pytest.mark.parametrize(
    ("fail_in", "hook", "recorded"),
    [
        (
            "backend.initialize",
            "TRITONBACKEND_Initialize (Backend.initialize)",
            ["backend.initialize"],
        ),
        (
            "model.initialize",
            "TRITONBACKEND_ModelInitialize (Model.initialize)",
            ["backend.initialize", "model.initialize", "backend.finalize"],
        ),
        (
            "instance.initialize",
            "TRITONBACKEND_ModelInstanceInitialize (ModelInstance.initialize)",
            [
                "backend.initialize",
                "model.initialize",
                "instance.initialize",
                "model.finalize",
                "backend.finalize",
            ],
        ),
    ],
)
def test_failing_hook_fails_the_load_and_finalizes_only_initialized_levels(
    layout: Layout, fail_in: str, hook: str, recorded: list[str]
) -> None:
    layout.install_recorder("model", fail_in=fail_in)
    err = layout.load_error()
    assert err.code == Code.INTERNAL
    assert err.message == (
        f"failed to load model 'm' version 1: {hook} failed: RuntimeError: {fail_in} exploded"
    )
    assert layout.calls() == recorded


def test_failing_finalizer_does_not_skip_the_others(layout: Layout) -> None:
    layout.install_recorder("model", fail_in="instance.finalize")
    with layout.harness() as h:
        h.infer({"IN": [1]})
    assert layout.calls() == LIFECYCLE


def test_exception_in_execute_fails_that_batch_and_the_host_carries_on(layout: Layout) -> None:
    layout.install_recorder("model")
    with layout.harness() as h:
        failed = h.execute([h.request({"IN": [2]}), h.request({"IN": [-1]})])
        error = InferpoolError(Code.INTERNAL, "RuntimeError: negative input -1")
        assert [(r.id, response.error, final) for r, response, final in failed if response] == [
            ("1", error, True),
            ("2", error, True),
        ]
        assert h.infer({"IN": [5, 6]})["OUT"].tolist() == [5, 6]
    assert layout.calls()[3:5] == ["instance.execute 2", "instance.execute 1"]


def test_per_request_error_does_not_sink_the_batch(layout: Layout) -> None:
    layout.install_recorder("model")
    with layout.harness() as h:
        batch = h.execute([h.request({"IN": [0]}), h.request({"IN": [3]})])
        bad, good = (response for _, response, _ in batch)
        assert bad is not None and bad.error == InferpoolError(
            Code.INVALID_ARG, "zero is not allowed"
        )
        assert good is not None and h.outputs_of(good)["OUT"].tolist() == [3]


@pytest.mark.parametrize("final_with_last", [False, True])
def test_decoupled_backend_streams_n_responses(layout: Layout, final_with_last: bool) -> None:
    layout.install("model", "streamer", STREAMER)
    with layout.harness("streamer", "model_transaction_policy { decoupled: true }") as h:
        data = np.array([3, 7, 9], dtype=np.int32)
        params = {"final_with_last": final_with_last}
        emitted = h.execute([h.request({"IN": data}, parameters=params)])
        copies = [h.outputs_of(r)["OUT"].tolist() for _, r, _ in emitted if r is not None]
        assert copies == [[3, 7, 9]] * 3
        finals = [final for _, _, final in emitted]
        assert finals == ([False, False, True] if final_with_last else [False] * 3 + [True])


def test_decoupled_request_with_no_responses_sends_only_the_final_flag(layout: Layout) -> None:
    layout.install("model", "streamer", STREAMER)
    with layout.harness("streamer", "model_transaction_policy { decoupled: true }") as h:
        [(_, response, final)] = h.execute([h.request({"IN": [0]})])
        assert response is None and final


def test_unanswered_request_gets_internal_naming_the_backend(layout: Layout) -> None:
    layout.install("model", "lazy", LAZY)
    with layout.harness("lazy") as h:
        batch = h.execute([h.request({"IN": [1]}), h.request({"IN": [2]})])
        assert [(r.id, response.error, final) for r, response, final in batch if response] == [
            (
                rid,
                InferpoolError(
                    Code.INTERNAL,
                    f"backend 'lazy' did not send a final response for request '{rid}' "
                    "of model 'm'",
                ),
                True,
            )
            for rid in ("1", "2")
        ]


class Size(tuple):
    """A tuple of ints of another type, as torch.Size is."""


@pytest.mark.parametrize("given", [list, tuple, Size])
@pytest.mark.parametrize(
    ("shape", "datatype"), [((), "FP32"), ((0, 3), "FP32"), ((2, 3), "FP16"), ((5,), "INT64")]
)
def test_response_output_is_a_writable_array_over_its_memory(shape, datatype, given) -> None:
    """Whatever sequence the shape is given as (the first time or again: a size worked
    out once is kept), the output has that shape as a tuple of ints."""
    memory = HeapMemory()
    request = Request(
        id="1", inputs={}, requested_outputs={}, memory=memory, emit=lambda *answer: None
    )
    response = request.response()
    array = response.output("OUT", given(shape), datatype)
    assert array.shape == shape and array.dtype == codec.numpy_dtype(datatype)
    array[...] = 7
    out = response.outputs["OUT"]
    assert type(out.shape) is tuple and all(type(d) is int for d in out.shape)
    assert (out.shape, out.byte_size) == (shape, array.nbytes)
    stored = np.frombuffer(memory.read(out.offset), array.dtype).reshape(shape)
    assert (stored == 7).all()  # written in place: no copy between the array and the memory
