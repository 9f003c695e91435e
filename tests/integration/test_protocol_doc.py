"""docs/PROTOCOL.md's exchange, byte by byte, is what a live broker sends and answers; and
the routing frames a DEALER client puts before the delimiter come back on every reply."""

from __future__ import annotations

import re

import zmq

from tests.support import ROOT, Server

SECTION = "## Example: one exchange, byte by byte"


def documented_frames() -> tuple[list[bytes], list[bytes]]:
    """The request's and the answer's frames, as the two tables give them."""
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    section = text[text.index(SECTION) :].split("\n## ", 1)[0]
    tables = []
    for table in re.findall(r"(?:^\| \d .*\n)+", section, re.M):
        frames = []
        for row in table.splitlines():
            size = re.search(r"\| (\d+) bytes", row)
            shown = re.search(r"`([^`]*)`", row)
            assert size is not None, row
            if size[1] == "0":
                frame = b""
            else:
                assert shown is not None, row
                frame = shown[1].encode() if "UTF-8" in row else bytes.fromhex(shown[1])
            assert len(frame) == int(size[1]), row
            frames.append(frame)
        tables.append(frames)
    request, answer = tables
    return request, answer


def test_the_documented_exchange_is_the_brokers(example_server: Server) -> None:
    request, answer = documented_frames()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.RCVTIMEO, 10000)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(example_server.endpoint)
        sock.send_multipart(request)
        assert sock.recv_multipart() == answer
        sock.send_multipart([b"t1", b"", b"{not json"])
        tag, delimiter, error = sock.recv_multipart()
        assert (tag, delimiter) == (b"t1", b"")
        assert error.startswith(
            b'{"type":"error","id":"","error":{"code":"INVALID_ARG","message":"malformed header: '
        )
    finally:
        sock.close()
        ctx.term()
