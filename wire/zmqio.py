"""Multipart messages on zmq sockets, the cheap way.

pyzmq's send_multipart/recv_multipart convert flags and socket options through Python
enums on every part (about 10 us per message pair here); these helpers pass plain ints,
read ``Frame.more`` instead of asking the socket and call the compiled ``send`` and ``recv``
under pyzmq's Python ones (which only add DRAFT options: 0.4 us a part), which is what the hot
paths of the broker, the workers and the clients need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

SNDMORE = int(zmq.SNDMORE)
NOBLOCK = int(zmq.NOBLOCK)
_send = zmq.backend.Socket.send  # (socket, data, flags, copy): the compiled send
# The compiled recv and Frame.more, taken from pyzmq's compiled classes: an attribute of its
# Python-level Socket and Frame goes through their __getattr__ hook (about 600 instructions)
_recv = zmq.backend.Socket.recv  # (socket, flags, copy)
_more = vars(zmq.backend.Frame)["more"].__get__  # (frame) -> whether more parts follow


def recv_frames(sock: zmq.Socket[Any], flags: int = 0) -> list[zmq.Frame]:
    """All parts of the next message, as zero-copy Frames (``flags``: 0 or NOBLOCK)."""
    frame = _recv(sock, flags, False)
    parts = [frame]
    while _more(frame):
        frame = _recv(sock, 0, False)  # the rest of a message is already here
        parts.append(frame)
    return parts


def send_parts(sock: zmq.Socket[Any], parts: Sequence[Any], copy: bool = True) -> None:
    """Send ``parts`` as one message (bytes, buffers or Frames)."""
    last = len(parts) - 1
    for i, part in enumerate(parts):
        _send(sock, part, SNDMORE if i < last else 0, copy)
