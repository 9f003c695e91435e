"""Inference calls a model makes to other served models while it runs (Triton's BLS).

A worker gives its model an :class:`InferenceCalls` (``Model.calls``; None where no broker
serves the model).  A call's inputs are read in place where they already lie in shared
memory (a request's own inputs, an earlier reply's outputs); any other array is copied once
into the worker's output arena.  A reply's outputs are views of the shared memory the called
model wrote them into, read-only, lent to this process until the last view of each is gone.

The channel to the broker is read by the worker's main thread only: a call waited for on
the main thread reads it (``execute`` itself; an asyncio loop on the main thread reads it
when :meth:`InferenceCalls.fileno` is readable, with :meth:`InferenceCalls.pump`); a call
waited for on another thread is answered once the main thread reads again (between
batches, or while it waits for a call of its own).  Code that blocks the main thread
without reading (a C backend's execute waiting for its call's callback) runs through
:meth:`InferenceCalls.run_blocked`: meanwhile another thread reads the channel for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from inferpool.backends.request_io import InputTensor
from inferpool.wire.errors import InferpoolError

T = TypeVar("T")


@dataclass(slots=True)
class CallInput:
    """One input of a call: where it lies in shared memory (``region`` set; ``data`` keeps
    the view alive while the call runs), or an array to copy there."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any = None  # numpy (object array of bytes for BYTES) or a device array
    region: str = ""
    offset: int = 0
    byte_size: int = 0


@dataclass(slots=True)
class CallRequest:
    """What a call asks for, as Triton's ``InferenceRequest`` has it (the request fields
    are named as ``backends.api.Request``'s)."""

    model_name: str
    inputs: Sequence[CallInput]
    requested_outputs: Sequence[str]
    model_version: int = -1  # the highest ready version
    id: str = ""
    correlation_id: int | str = 0
    flags: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)
    timeout_us: int = 0  # 0: no limit
    parent: int = 0  # the handle of the request passed as its trace (0: none)


@dataclass(slots=True)
class CallReply:
    """One response to a call: outputs (read-only views) and parameters, or an error."""

    outputs: dict[str, InputTensor]
    parameters: dict[str, Any]
    error: InferpoolError | None
    final: bool


class PendingCall(Protocol):
    """One inference call in flight: its replies as they come."""

    def next(self) -> CallReply:
        """The next reply, waiting for it; after the final one, InferpoolError."""
        ...

    def ready(self) -> bool:
        """Whether :meth:`next` would return without waiting."""
        ...

    def notify(self, listener: Callable[[], None] | None) -> None:
        """Call ``listener`` (on the main thread) whenever a reply arrives."""
        ...

    def cancel(self) -> None:
        """Give up on the call (unless it is over): the called request is cancelled as a
        client's is; the replies up to its end still come."""
        ...


class InferenceCalls(Protocol):
    """How a model calls other served models (Triton's BLS) from its worker."""

    def start(self, request: CallRequest, decoupled: bool) -> PendingCall:
        """Send a call (``decoupled``: any number of replies may come); InferpoolError if it
        cannot be sent (an input that cannot be placed)."""
        ...

    def query(self, model_name: str, model_version: int, labels: bool = False) -> dict[str, Any]:
        """What the broker knows of a served model, waiting for it: {"ready", "decoupled",
        "max_batch_size", "version", "config", "metadata"} (the last two JSON texts), with
        ``labels`` its outputs' labels too ("labels": {output: [label, ...]}); InferpoolError
        with Triton's message for a model that is not served."""
        ...

    def run_blocked(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)``, code that may wait for calls without reading the channel (a
        C backend's execute): on the thread that reads the channel, another thread reads it
        until ``function`` returns."""
        ...

    def locate(self, address: int, nbytes: int) -> tuple[str, int] | None:
        """(region, offset) of ``nbytes`` at ``address`` where a call may pass them by
        reference (shared memory that outlives the caller's answers); None: copy them."""
        ...

    def fileno(self) -> int:
        """The channel, readable when a reply (or another message) waits."""
        ...

    def pump(self) -> None:
        """Handle the message waiting on the channel, if one does; never waits (main
        thread)."""
        ...

    def pending(self) -> int:
        """How many calls still wait for their final reply."""
        ...
