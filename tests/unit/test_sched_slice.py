"""The server's processes ask Linux for a short scheduler slice, and what they start keeps it
(broker/sched_slice.py); the CLI takes the kernel's range only."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from inferpool.broker.sched_slice import current_slice_ns
from inferpool.usage import parse_slice

# asks for 300 us, then reports its own slice and that of a child it starts (fork + exec)
ASK = """
import subprocess, sys
from inferpool.broker.sched_slice import current_slice_ns, request_slice
asked = request_slice(int(sys.argv[1]))
child = subprocess.run([sys.executable, "-c", "from inferpool.broker.sched_slice import "
                        "current_slice_ns; print(current_slice_ns())"], capture_output=True,
                       text=True, check=True).stdout.strip()
print(asked, current_slice_ns(), child)
"""


def _ask(us: int) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", ASK, str(us)], capture_output=True, text=True, check=True
    )
    return done.stdout.split()


def test_a_slice_asked_for_holds_for_the_children() -> None:
    asked, own, child = _ask(300)
    if asked != "True" or own != "300000":
        pytest.skip("this kernel keeps its own slices (custom slices came with Linux 6.12)")
    assert child == own


def test_zero_asks_for_nothing() -> None:
    asked, own, child = _ask(0)
    assert asked == "False" and own == child == str(current_slice_ns())  # this process's


@pytest.mark.parametrize("text", ["50", "100001", "-1", "fast"])
def test_the_cli_takes_the_kernels_range_only(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="100 to 100000"):
        parse_slice(text)
    assert parse_slice("0") == 0 and parse_slice("300") == 300
