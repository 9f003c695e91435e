"""Where an instance runs: its device, its CUDA streams, and the events that time a GPU execution.

KIND_CPU runs on the CPU, KIND_GPU on ``cuda:<ordinal>`` with its own stream, KIND_MODEL
wherever the model puts itself, with one stream per visible GPU (as the seed, which cannot
know which devices such a model uses).  The ordinal is the instance's device in this
process: a KIND_GPU worker sees only its GPU, as ``cuda:0``, whatever Triton's device id
(which names the instance in messages).  On a machine without CUDA nothing here touches
``torch.cuda`` beyond asking how many devices there are, so everything imports and runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from inferpool.wire.errors import unavailable


class Placement:
    """Device, streams, and the CUDA events that time an execution where it runs on a GPU."""

    def __init__(self, kind: str, device_id: int, ordinal: int, instance: str) -> None:
        self.kind = kind
        self.device: torch.device | None = torch.device("cpu")
        self.streams: list[torch.cuda.Stream] = []
        self.events: list[torch.cuda.Event] = []  # none on the CPU
        device_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if kind == "GPU":
            if ordinal >= device_count:
                raise unavailable(
                    f"instance '{instance}' is KIND_GPU on device {device_id} (CUDA device "
                    f"{ordinal} of its worker), but torch sees {device_count} CUDA device(s) "
                    f"(torch.cuda.is_available() is {torch.cuda.is_available()})"
                )
            self.device = torch.device("cuda", ordinal)
            self.streams = [torch.cuda.Stream(device=self.device)]
            self.events = self._new_events(ordinal)
        elif kind == "MODEL":
            self.device = None  # the model places itself
            self.streams = [torch.cuda.Stream(device=i) for i in range(device_count)]
            if self.streams:
                self.events = self._new_events(0)
        elif kind != "CPU":
            raise unavailable(f"instance '{instance}' has unknown kind '{kind}'")

    @staticmethod
    def _new_events(device_id: int) -> list[torch.cuda.Event]:
        with torch.cuda.device(device_id):
            return [torch.cuda.Event(enable_timing=True) for _ in range(3)]

    @property
    def input_device(self) -> torch.device:
        """Where inputs are gathered: the GPU for KIND_GPU, else the CPU (KIND_MODEL too)."""
        return self.device if self.device is not None else torch.device("cpu")

    @property
    def uses_cuda(self) -> bool:
        return bool(self.streams)

    def around(
        self, inner: contextlib.AbstractContextManager[Any]
    ) -> contextlib.AbstractContextManager[Any]:
        """``inner`` (an execution's settings) with this instance's streams and device made
        current around it: KIND_GPU's own device, for KIND_MODEL the one that was current
        (the model chooses its devices itself).  On the CPU, ``inner`` as it is."""
        return self._cuda_active(inner) if self.streams else inner

    @contextlib.contextmanager
    def _cuda_active(self, inner: contextlib.AbstractContextManager[Any]) -> Iterator[Any]:
        """``torch.cuda.set_stream`` also makes the stream's device current, so after one
        stream per GPU the last GPU would be; the device is set back once they are set."""
        with contextlib.ExitStack() as stack:
            before = torch.cuda.current_device()
            stack.callback(torch.cuda.set_device, before)  # runs last: the device as found
            for stream in self.streams:
                previous = torch.cuda.current_stream(stream.device)
                torch.cuda.set_stream(stream)
                stack.callback(torch.cuda.set_stream, previous)
            torch.cuda.set_device(self.device if self.device is not None else before)
            with inner as value:
                yield value

    def record(self, which: int) -> None:
        """CUDA event 0 (input start), 1 (infer start) or 2 (output start), in this order;
        only where ``events`` time the execution (the wall clock times it on the CPU)."""
        if which == 2 and self.kind == "MODEL":
            for stream in self.streams:  # the model may have used any of them
                stream.synchronize()
        self.events[which].record(self.streams[0])

    def event_span(self, exec_start: int, infer_start: int, output_start: int) -> tuple[int, int]:
        """(compute_start, compute_end) in the seed's terms from the three recorded events;
        KIND_MODEL's infer time by the wall clock (streams on several devices)."""
        self.streams[0].synchronize()
        input_ns = int(self.events[0].elapsed_time(self.events[1]) * 1e6)
        if self.kind == "GPU":
            infer_ns = int(self.events[1].elapsed_time(self.events[2]) * 1e6)
        else:
            infer_ns = output_start - infer_start
        compute_start = exec_start + input_ns
        return compute_start, compute_start + infer_ns

    def clear_cache(self) -> None:
        """ENABLE_CACHE_CLEANING: give cached CUDA blocks back after an execution."""
        if self.uses_cuda:
            torch.cuda.empty_cache()

    def close(self) -> None:
        if self.uses_cuda:
            for stream in self.streams:
                stream.synchronize()
            torch.cuda.empty_cache()
        self.streams = []
        self.events = []
