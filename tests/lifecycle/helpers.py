"""Lifecycle test helpers: a python model that misbehaves on request, and checks on a run."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from inferpool.client import Client, InferpoolError
from tests.support import Server, write_model

# What the "act" model does, by the value of its input ACT[0].
REPORT, EXIT, SEGFAULT, SPIN, NAP, FRAGILE, TORCH = 0, 1, 2, 3, 4, 5, 6

ACT_MODEL = """
import ctypes, json, os, sys, time
import numpy as np
import triton_python_backend_utils as pb_utils

VALUE = 1  # the test rewrites this line to change the model's behaviour


def hold_the_gil():
    while True:
        pass


def nap_for_a_minute():
    time.sleep(60)


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def report(self, with_torch):
        from inferpool.workers.pinning import read_back  # the worker's own view, via get_mempolicy
        info = {"pid": os.getpid(), "instance": self.instance, "value": VALUE,
                "affinity": sorted(os.sched_getaffinity(0)), "placement": read_back()}
        if with_torch:
            import torch
            info["torch_threads"] = torch.get_num_threads()
        return json.dumps(info).encode()

    def execute(self, requests):
        responses = []
        for request in requests:
            act = int(pb_utils.get_input_tensor_by_name(request, "ACT").as_numpy()[0])
            if act == 1:
                os._exit(7)
            if act == 2:
                ctypes.string_at(0)  # a real SIGSEGV
            if act == 3:
                hold_the_gil()
            if act == 4:
                nap_for_a_minute()
            if act == 5 and self.instance.startswith("fragile"):
                os._exit(9)
            out = np.array([self.report(act == 6)], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("INFO", out)]))
        return responses
"""


def act_config(name: str, extra: str = "") -> str:
    return f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "ACT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]
        {extra}
    """


def write_act_model(repo: Path, name: str, extra: str = "", value: int = 1) -> Path:
    code = ACT_MODEL.replace("VALUE = 1", f"VALUE = {value}")
    return write_model(repo, name, act_config(name, extra), files={"1/model.py": code})


def act(client: Client, model: str, what: int = REPORT) -> dict[str, Any]:
    out = client.infer(model, {"ACT": np.array([what], np.int32)})
    return dict(json.loads(out["INFO"][0]))


def send_act(client: Client, model: str, what: int) -> str:
    """Send without waiting; ``client._recv(rid, timeout)`` collects the answer."""
    return client._send(
        {
            "type": "infer",
            "model_name": model,
            "inputs": [{"name": "ACT", "datatype": "INT32", "shape": [1]}],
        },
        [np.array([what], np.int32).data],
    )


def instance(client: Client, name: str) -> dict[str, Any]:
    return next(r for r in client.status() if r["instance"] == name)


class Stream:
    """A client thread sending requests back to back; records every answer."""

    def __init__(self, server: Server, model: str, inputs: Callable[[], dict[str, Any]]):
        self.results: list[dict[str, Any]] = []
        self.errors: list[InferpoolError] = []
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(server, model, inputs))
        self._thread.start()

    def _run(self, server: Server, model: str, inputs: Callable[[], dict[str, Any]]) -> None:
        with server.client(timeout=30) as c:
            while not self._stop.is_set():
                self.sent += 1
                try:
                    self.results.append(c.infer(model, inputs()))
                except InferpoolError as err:
                    self.errors.append(err)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "a request was never answered"
        assert self.sent == len(self.results) + len(self.errors)
