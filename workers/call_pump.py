"""Reading a worker's channel for its main thread while that thread cannot.

The channel is read by the main thread only.  A C backend's execute runs on the main thread
and may wait in C for a call's response callback (Triton's ``bls`` example waits on a
``std::future``): the main thread cannot read the reply it waits for.  While such code runs
(``ChannelCalls.run_blocked``) and a call waits, a reader thread stands in: it delivers
replies (the backend's callbacks run on it) and keeps every other message for the main
thread, which handles them once the code returns.  Before the main thread reads again, the
reader thread has stopped reading: only one thread reads at a time.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

from inferpool.wire.worker.protocol import BrokerMessage

Kept = Callable[[BrokerMessage], None]


class StandInReader:
    """A thread that reads the channel while the main thread is blocked."""

    def __init__(self, fileno: int, read: Callable[[Kept], None], over: Callable[[], bool]):
        """``read(keep)`` handles one waiting message (replies are delivered, the rest go to
        ``keep``); ``over()``: the channel has nothing more to give (closed, or Stop)."""
        self._fileno = fileno
        self._read = read
        self._over = over
        self.blocked = False  # the main thread runs code that does not read
        self._reading = False  # the stand-in reads (only while blocked)
        self._main_reads = False  # the blocked main thread, waiting in Python, reads itself
        self._state = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wake_rx, self._wake_tx = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.kept: list[BrokerMessage] = []

    def block(self) -> None:
        """The main thread is about to run code that does not read (main thread)."""
        self.blocked = True

    def unblock(self) -> list[BrokerMessage]:
        """The main thread reads again (main thread): the stand-in has stopped reading once
        this returns; the messages it kept for the main thread, in order."""
        with self._state:
            self.blocked = False
            if self._reading:
                os.write(self._wake_tx, b"!")
                self._state.wait_for(lambda: not self._reading)
        kept, self.kept = self.kept, []
        return kept

    def is_current(self) -> bool:
        """Whether the calling thread is the stand-in (a backend's callback, run as it
        delivers a reply, that waits for another reply reads it itself)."""
        thread = self._thread
        return thread is not None and thread.ident == threading.get_ident()

    def take(self) -> bool:
        """The blocked main thread waits for a reply in Python (a query its backend made):
        whether it may read itself, the stand-in not reading (then until give_back)."""
        with self._state:
            if self._reading:
                return False
            self._main_reads = True
            return True

    def give_back(self) -> None:
        """The main thread has stopped reading (after take)."""
        with self._state:
            self._main_reads = False

    def want(self) -> None:
        """A call waits for a reply (any thread): read for the main thread if it is
        blocked (and not reading itself)."""
        with self._state:
            if not self.blocked or self._reading or self._main_reads or self._over():
                return
            self._reading = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="inferpool-call-reader", daemon=True
                )
                self._thread.start()
            else:
                self._state.notify_all()

    def _run(self) -> None:
        state = self._state
        while True:
            with state:
                state.wait_for(lambda: self._reading)
            ready = select.select([self._fileno, self._wake_rx], [], [])[0]
            if self._wake_rx in ready:
                os.read(self._wake_rx, 64)
            with state:
                if not self.blocked:
                    self._reading = False
                    state.notify_all()
                    continue
            if self._fileno in ready:
                self._read(self.kept.append)
            if self._over():
                with state:
                    self._reading = False
                    state.notify_all()
