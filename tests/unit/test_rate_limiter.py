"""The rate limiter's rules, as Triton's: resources by device or global, how many there are,
who gets them (scaled priority, first in line), and its load errors."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.rate_limiter import RateLimiter
from inferpool.wire.errors import InferpoolError


def config(name: str, resources: str, priority: int = 0) -> pb.ModelConfig:
    text = f"""
        name: "{name}"
        instance_group [ {{ name: "g" count: 1
            rate_limiter {{ {resources} priority: {priority} }} }} ]
    """
    return text_format.Parse(text, pb.ModelConfig())


def limiter_with(*instances: tuple[str, str, int, int], explicit: tuple[str, ...] = ()):
    """(name, resources, priority, device) per instance."""
    limiter = RateLimiter.from_options(explicit)
    for name, resources, priority, device in instances:
        limiter.add(name, config(name, resources, priority), "g", device)
    return limiter


def ran(granted) -> list[str]:
    return [instance for instance, _ in granted]


def test_by_default_there_are_as_many_of_a_resource_as_any_instance_needs() -> None:
    limiter = limiter_with(
        ("big", 'resources [ { name: "R" global: true count: 2 } ]', 0, 0),
        ("small", 'resources [ { name: "R" global: true count: 1 } ]', 0, 0),
    )
    assert limiter.available() == {-1: {"R": 2}}
    assert ran(limiter.acquire("big", "b1")) == ["big"]
    assert ran(limiter.acquire("small", "s1")) == []  # 2 + 1 > 2: staged
    assert ran(limiter.release("big")) == ["small"]
    assert ran(limiter.acquire("big", "b2")) == []  # small holds 1 of 2
    assert limiter.release("small") == [("big", "b2")]


def test_device_resources_are_counted_per_device() -> None:
    limiter = limiter_with(
        ("gpu0", 'resources [ { name: "R" count: 1 } ]', 0, 0),
        ("gpu1", 'resources [ { name: "R" count: 1 } ]', 0, 1),
        ("also0", 'resources [ { name: "R" count: 1 } ]', 0, 0),
    )
    assert ran(limiter.acquire("gpu0", 1)) == ["gpu0"]
    assert ran(limiter.acquire("gpu1", 1)) == ["gpu1"]  # its own device's R
    assert ran(limiter.acquire("also0", 1)) == []  # device 0's R is taken
    assert ran(limiter.release("gpu1")) == []
    assert ran(limiter.release("gpu0")) == ["also0"]


def test_priority_two_gets_half_the_chances_of_priority_one() -> None:
    limiter = limiter_with(
        ("high", 'resources [ { name: "R" global: true count: 1 } ]', 1, 0),
        ("low", 'resources [ { name: "R" global: true count: 1 } ]', 2, 0),
    )
    runs = ran(limiter.acquire("high", 0)) + ran(limiter.acquire("low", 0))
    for i in range(59):  # both always have work: the one running stages its next batch,
        assert ran(limiter.acquire(runs[-1], i)) == []  # then finishes
        runs += ran(limiter.release(runs[-1]))
    assert (runs.count("high"), runs.count("low")) == (40, 20)


def test_the_first_in_line_is_not_passed() -> None:
    limiter = limiter_with(
        ("wide", 'resources [ { name: "R" global: true count: 2 } ]', 0, 0),
        ("narrow", 'resources [ { name: "R" global: true count: 1 } ]', 0, 0),
        ("none", "", 0, 0),
    )
    assert ran(limiter.acquire("narrow", 1)) == ["narrow"]
    assert ran(limiter.acquire("wide", 1)) == []  # needs 2, 1 is free
    assert ran(limiter.acquire("none", 1)) == []  # staged after wide: waits behind it
    assert ran(limiter.release("narrow")) == ["wide", "none"]


def test_an_instance_that_goes_away_drops_its_batch_and_frees_what_it_held() -> None:
    limiter = limiter_with(
        ("a", 'resources [ { name: "R" global: true count: 1 } ]', 0, 0),
        ("b", 'resources [ { name: "R" global: true count: 1 } ]', 0, 0),
        ("c", 'resources [ { name: "R" global: true count: 1 } ]', 0, 0),
    )
    assert ran(limiter.acquire("a", 1)) == ["a"]
    assert ran(limiter.acquire("b", 1)) == []
    assert ran(limiter.acquire("c", 1)) == []
    assert ran(limiter.forget("b")) == []  # b's batch is dropped, a still holds R
    assert ran(limiter.forget("a")) == ["c"]


def test_explicit_counts_apply_to_every_device_or_to_one() -> None:
    limiter = limiter_with(
        ("a", 'resources [ { name: "R" count: 2 } ]', 0, 0),
        ("b", 'resources [ { name: "R" count: 1 } ]', 0, 1),
        explicit=("R:2", "R:4:1"),
    )
    assert limiter.available() == {0: {"R": 2}, 1: {"R": 4}}


@pytest.mark.parametrize(
    ("instances", "explicit", "words"),
    [
        (
            [
                ("a", 'resources [ { name: "R" global: true count: 1 } ]', 0, 0),
                ("b", 'resources [ { name: "R" count: 1 } ]', 0, 0),
            ],
            (),
            'Resource "R" is present as both global and device-specific resource in the model '
            "configuration.",
        ),
        (
            [("a", 'resources [ { name: "R" count: 3 } ]', 0, 0)],
            ("R:2",),
            'Resource count for "R" is limited to 2 which will prevent scheduling of one or more '
            "model instances, the minimum required count is 3",
        ),
        (
            [("a", 'resources [ { name: "S" global: true count: 1 } ]', 0, 0)],
            ("R:2",),
            'Resource count for "S" is limited to 0',
        ),
    ],
)
def test_a_model_the_server_could_never_run_fails_its_load(instances, explicit, words) -> None:
    with pytest.raises(InferpoolError) as err:
        limiter_with(*instances, explicit=explicit)
    assert err.value.code.value == "INVALID_ARG" and words in err.value.message
