"""--model-load-gpu-limit: parsing and validation (broker side) and the check (worker side);
served for real in tests/lifecycle/test_placement_served.py where there is a GPU."""

from __future__ import annotations

import pytest

from inferpool.broker.pool.gpu_limit import check_gpu_limits, limit_for, parse_gpu_limits
from inferpool.broker.pool.topology import Topology
from inferpool.wire.errors import Code, InferpoolError
from inferpool.workers.gpu_memory_check import check_load_limit

TWO_GPUS = Topology(cpus=(0, 1), nodes={0: (0, 1)}, gpus=("0", "1"))
NO_GPUS = Topology(cpus=(0, 1), nodes={0: (0, 1)})
GiB = 1 << 30


def error(fn, *args, **kwargs) -> InferpoolError:
    with pytest.raises(InferpoolError) as info:
        fn(*args, **kwargs)
    return info.value


def test_parse_device_fractions_the_last_flag_wins() -> None:
    assert parse_gpu_limits(["0:0.5", "1:0.8", "0:0.25"]) == {0: 0.25, 1: 0.8}
    assert parse_gpu_limits([]) == {}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0.5", "expected DEVICE:FRACTION, e.g. 0:0.8"),
        ("gpu0:0.5", "expected DEVICE:FRACTION"),
        ("0:half", "'half' is not a number between 0 and 1"),
        ("0:0", "more than 0 and at most 1"),
        ("0:1.5", "more than 0 and at most 1"),
    ],
)
def test_bad_flags_name_the_flag_and_the_fix(text: str, needle: str) -> None:
    err = error(parse_gpu_limits, [text])
    assert err.code is Code.INVALID_ARG
    assert f"--model-load-gpu-limit={text}" in err.message and needle in err.message


def test_devices_must_exist() -> None:
    check_gpu_limits({0: 0.5, 1: 0.5}, TWO_GPUS)
    assert (
        "this machine has no GPU 2 (GPUs: 0, 1)"
        in error(check_gpu_limits, {2: 0.5}, TWO_GPUS).message
    )
    assert "no GPU 0 (GPUs: none)" in error(check_gpu_limits, {0: 0.5}, NO_GPUS).message


def test_only_gpu_instances_are_limited() -> None:
    limits = {1: 0.5}
    assert limit_for(limits, "GPU", 1) == 0.5
    assert limit_for(limits, "GPU", 0) == 1.0
    assert limit_for(limits, "CPU", 1) == 1.0


def test_the_check_rejects_a_device_used_beyond_the_fraction() -> None:
    def four_of_ten_used(ordinal: int) -> tuple[int, int]:
        assert ordinal == 0  # a GPU instance's worker sees its device as ordinal 0
        return 6 * GiB, 10 * GiB

    check_load_limit("m", 3, 0, 0.5, four_of_ten_used)
    err = error(check_load_limit, "m", 3, 0, 0.3, four_of_ten_used)
    assert err.code is Code.UNAVAILABLE
    assert err.message == (
        "can not create model 'm': memory limit set for KIND_GPU 3 has exceeded, "
        "model loading is rejected (4096 MiB of 10240 MiB in use, limit 0.3)"
    )


def test_no_limit_reads_nothing_and_an_unreadable_device_is_a_clear_error() -> None:
    def broken(ordinal: int) -> tuple[int, int]:
        raise RuntimeError("no CUDA driver")

    check_load_limit("m", 0, 0, 1.0, broken)  # no limit: the device is never asked
    err = error(check_load_limit, "m", 0, 0, 0.9, broken)
    assert err.code is Code.UNAVAILABLE
    assert "cannot read the memory of GPU 0" in err.message and "no CUDA driver" in err.message
