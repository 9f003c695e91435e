"""A lane's region, byte by byte: what a client and a worker instance agree on (PROTOCOL.md).

A lane is a pair of single-producer/single-consumer rings in one shared-memory region the
broker created: requests from the client to the worker, responses back.  Everything is
little-endian and struct-packed; nothing is JSON.  The region:

    0      header      magic, version, geometry, state (written by the broker)
    64     client line req_seq (futex), client_sleeping, resp_done, client_apart (the client)
    128    worker line resp_seq (futex), worker_sleeping, req_done, worker_closed (the worker)
    512    reason      why the lane was revoked (UTF-8, NUL-padded; the broker)
    4096   requests    ``slots`` request slots of ``slot_size`` bytes
    ...    responses   ``slots`` response slots of ``slot_size`` bytes

Request ``n`` (counted from 0) lies in request slot ``n % slots`` and its response in
response slot ``n % slots``; a client has at most ``slots`` requests unanswered.  Sequence
words count modulo 2**32.  The records in the slots: wire/lane_records.py (requests) and
wire/lane_responses.py (responses).
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

MAGIC = b"IPL1"
VERSION = 1
HEADER_BYTES = 4096
REASON_OFFSET, REASON_BYTES = 512, 512
DEFAULT_SLOTS = 8
MAX_SLOTS = 64
SLOT_SIZE = 4096  # at most 65535: an error message's length is a u16
MAX_PID = 1 << 22  # Linux's PID_MAX_LIMIT: no process id is larger

# the header (broker): magic, version, slots, slot_size, state, reason code
_HEADER = struct.Struct("<4sIIIII")
STATE = 16
STATE_OPEN, STATE_REVOKED = 0, 1
# set (the broker) before the lane is revoked while its client lives: the outputs the client
# holds stay valid, as its leases, released through the broker by ``lane_token``
KEPT = 24
# the output memory (KiB, rounded up) the client's principal held when the broker last
# wrote it: on its connections, and on its lanes as their workers last reported (the
# broker writes it when that crosses the principal's share and when a lane reports; the
# worker refuses the lane's requests while the principal holds its share)
HELD_KIB = 28
# the client's line; CLIENT_APART: 1 while the client's waiting thread, when it last looked,
# ran on a core its worker may not run on (the worker may then spin for its next request)
REQ_SEQ, CLIENT_SLEEPING, RESP_DONE, CLIENT_APART = 64, 68, 72, 76
# the worker's line
RESP_SEQ, WORKER_SLEEPING, REQ_DONE, WORKER_CLOSED = 128, 132, 136, 140

BELLS = (REQ_SEQ, WORKER_SLEEPING, RESP_SEQ, CLIENT_SLEEPING)  # shm.bell.bells' offsets

# request flags
FLAG_RELEASE_ONLY = 1  # no inference: only the releases (answered with no outputs)
FLAG_CANCELLED = 2  # set by the client after posting, while unanswered: cancel_request
FLAG_AFTER = 4  # runs after another lane's response (an ensemble's step): lane_records.After
FLAGS_AT = 16  # a request slot's flags: the one field a client writes in a posted slot
# An output index with this bit: in a request's wanted outputs, a window in the client's
# input region follows for it (the output is to be written there, if it fits); in a
# response's tensor entry, the output lies in the client's input region at its offset.
PLACED = 0x8000

# Triton's TRITONSERVER_DataType numbers
DATATYPES = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}
DATATYPE_NAMES = {v: k for k, v in DATATYPES.items()}
# a response's status: 0 success, else the error's code
CODES = (
    "",
    "INVALID_ARG",
    "NOT_FOUND",
    "UNAVAILABLE",
    "UNSUPPORTED",
    "INTERNAL",
    "ALREADY_EXISTS",
    "CANCELLED",
    "TIMEOUT",
    "UNKNOWN",
)
STATUS = {name: i for i, name in enumerate(CODES) if name}


class Geometry(NamedTuple):
    """A lane region's shape: its slots and their size."""

    slots: int
    slot_size: int

    @property
    def size(self) -> int:
        """The region's size."""
        return HEADER_BYTES + 2 * self.slots * self.slot_size

    def request(self, n: int) -> int:
        """The offset of request slot of request number ``n``."""
        return HEADER_BYTES + (n % self.slots) * self.slot_size

    def response(self, n: int) -> int:
        return HEADER_BYTES + (self.slots + n % self.slots) * self.slot_size


class Tensor(NamedTuple):
    """An input (in the client's region) or an output (in the worker's output region)."""

    position: int  # in the model's inputs or outputs, in the order of its configuration
    datatype: int  # DATATYPES
    offset: int
    byte_size: int
    shape: tuple[int, ...]


class LaneRequest(NamedTuple):
    """A request as the worker reads it: its body still packed (``parse_body``), so that a
    body seen before is known by its bytes."""

    id: int
    sent_ns: int  # when the client sent it (CLOCK_MONOTONIC, the same clock in every process)
    flags: int
    n_inputs: int
    n_outputs: int
    body: bytes
    releases: list[int]  # tokens of outputs the client is done with


class LaneResponse(NamedTuple):
    """A response as a lane's reader takes it from a slot."""

    id: int
    status: int  # 0, or STATUS of the error's code
    outputs: list[Tensor]
    parameters: dict[str, Any]
    error: str
    size: int  # the record's length in bytes (a reader knows a record it read before by them)


# ---------------------------------------------------------------------------- the header
def header_bytes(geometry: Geometry) -> bytes:
    """A new lane's header fields (the broker writes them once, before the lane is
    granted)."""
    return _HEADER.pack(MAGIC, VERSION, geometry.slots, geometry.slot_size, 0, 0)


def init_header(buf: Any, geometry: Geometry) -> None:
    """A new lane's header, written into a mapping of its region."""
    buf[: _HEADER.size] = header_bytes(geometry)


def revocation(status: int, reason: str) -> tuple[tuple[int, bytes], ...]:
    """What revoking a lane writes, in order ((offset, bytes) each): why, then the code,
    then the state a peer looks at first (the broker)."""
    text = reason.encode()[: REASON_BYTES - 1].ljust(REASON_BYTES, b"\0")
    return (
        (REASON_OFFSET, text),
        (STATE + 4, struct.pack("<I", status)),
        (STATE, struct.pack("<I", STATE_REVOKED)),
    )


def read_header(buf: Any) -> tuple[Geometry, int, int]:
    """(geometry, state, reason status); ValueError if this is not a lane of this version."""
    magic, version, slots, slot_size, state, code = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a version {VERSION} lane (magic {magic!r}, version {version})")
    return Geometry(slots, slot_size), state, code


class Header:
    """A mapping of a lane's header: its geometry, its state, its 32-bit words.

    Each word is read and written with one aligned 32-bit access through a cast memoryview
    (``header[offset]``).  Never ``struct.pack_into`` a word a peer reads: it zero-fills the
    field before it writes it, and a peer can read that 0.
    """

    __slots__ = ("buf", "words")

    def __init__(self, buf: memoryview) -> None:
        self.buf = buf
        self.words = buf[:HEADER_BYTES].cast("I")

    def __getitem__(self, offset: int) -> int:
        return int(self.words[offset >> 2])

    def __setitem__(self, offset: int, value: int) -> None:
        self.words[offset >> 2] = value & 0xFFFFFFFF

    @property
    def revoked(self) -> bool:
        return bool(self.words[STATE >> 2])

    def reason(self) -> tuple[str, str]:
        """(code name, message) of a revoked lane."""
        raw = bytes(self.buf[REASON_OFFSET : REASON_OFFSET + REASON_BYTES]).split(b"\0", 1)[0]
        return code_name(self[STATE + 4]), raw.decode(errors="replace")

    def release(self) -> None:
        """Let go of the mapping (before it is closed)."""
        self.words.release()


class Layout(NamedTuple):
    """Where a lane region's parts lie: its geometry, its header's words, each slot's offset."""

    geometry: Geometry
    header: Header
    request_at: list[int]  # the offset of request slot i
    response_at: list[int]  # the offset of response slot i


def layout(buf: memoryview, size: int) -> Layout:
    """The layout of a mapped lane region of ``size`` bytes, as both of its ends read it;
    ValueError if it is not a lane of this version or is smaller than its geometry."""
    if size < HEADER_BYTES:
        raise ValueError(f"a lane region of {size} bytes is smaller than a lane's header")
    geometry, _, _ = read_header(buf)
    if geometry.size > size:
        raise ValueError(f"a lane region of {size} bytes is smaller than its geometry")
    slots = range(geometry.slots)
    return Layout(
        geometry,
        Header(buf),
        [geometry.request(i) for i in slots],
        [geometry.response(i) for i in slots],
    )


def lane_token(lane: int, offset: int) -> str:
    """The lease token of an output a client held when its lane ended (KEPT): its lane and
    its offset in the worker's output region."""
    return f"lane{lane}.{offset}"


def parse_lane_token(token: object) -> tuple[int, int] | None:
    """(lane, offset) of a ``lane_token``; None for any other token."""
    if not isinstance(token, str) or not token.startswith("lane"):
        return None
    lane, _, offset = token[4:].partition(".")
    if not (lane.isdecimal() and offset.isdecimal()):
        return None
    return int(lane), int(offset)


def code_name(status: int) -> str:
    """The error code a lane's status number stands for."""
    return CODES[status] if 0 < status < len(CODES) else "UNKNOWN"
