"""Every ModelConfig field inferpool does not implement is named at load, never ignored
silently: each one is set in turn (found by walking the schema) and must be warned about."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.config_support import (
    HONORED,
    NEEDS_FLAG,
    ConfigSupport,
    unimplemented,
)
from tests.support import EXAMPLES

BASE = """
name: "m" backend: "identity" max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
version_policy: { latest: { num_versions: 1 } }
dynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 100
                   priority_levels: 2 default_priority_level: 1 }
instance_group [ { name: "g" kind: KIND_CPU count: 2 host_policy: "cpu" } ]
parameters { key: "k" value: { string_value: "v" } }
model_warmup [ { name: "w" batch_size: 1 } ]
model_transaction_policy { decoupled: false }
default_model_filename: "model.pt"
"""


def base() -> pb.ModelConfig:
    return text_format.Parse(BASE, pb.ModelConfig())


def unhonored_paths(descriptor: Any = pb.ModelConfig.DESCRIPTOR, prefix: str = "") -> list[str]:
    """Every field path of the schema that the server does not implement, at the depth where
    the check names it."""
    inside = {
        ".".join(p.split(".")[:depth])
        for p in HONORED | set(NEEDS_FLAG)
        for depth in range(1, p.count(".") + 1)
    }
    paths = []
    for field in descriptor.fields:
        path = prefix + field.name
        if path in HONORED:
            continue
        if path in inside:
            paths += unhonored_paths(field.message_type, path + ".")
        else:
            paths.append(path)
    return paths


def set_field(message: Any, path: str) -> None:
    """Give ``path`` of ``message`` a value that counts as set."""
    name, _, rest = path.partition(".")
    field = message.DESCRIPTOR.fields_by_name[name]
    value = getattr(message, name)
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        entry_value = field.message_type.fields_by_name["value"]
        if entry_value.message_type is not None:
            value["k"].SetInParent()
        else:
            value["k"] = _scalar(entry_value)
    elif field.message_type is not None:
        target = value.add() if field.is_repeated else value
        if rest:
            set_field(target, rest)
        else:
            target.SetInParent()
    elif field.is_repeated:
        value.append(_scalar(field))
    else:
        setattr(message, name, _scalar(field))


def _scalar(field: Any) -> Any:
    if field.enum_type is not None:
        return field.enum_type.values[-1].number
    kind = field.cpp_type
    if kind == field.CPPTYPE_BOOL:
        return True
    if kind == field.CPPTYPE_STRING:
        return b"x" if field.type == field.TYPE_BYTES else "x"
    if kind in (field.CPPTYPE_FLOAT, field.CPPTYPE_DOUBLE):
        return 0.5
    return 1


def test_a_config_of_implemented_fields_loads_without_a_warning(caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert ConfigSupport().check(base()) is None
    assert caplog.records == []


def test_the_walk_covers_the_fields_users_trip_over() -> None:
    paths = unhonored_paths()
    for path in (
        "runtime",
        "input.format",
        "optimization",
        "dynamic_batching.preserve_ordering",
        "sequence_batching.oldest.preserve_ordering",
        "sequence_batching.iterative_sequence",
        "sequence_batching.state.use_growable_memory",
        "instance_group.profile",
        "instance_group.rate_limiter",
        "response_cache",
        "model_repository_agents",
    ):
        assert path in paths


@pytest.mark.parametrize("path", unhonored_paths())
def test_every_unimplemented_field_is_named_at_load(path: str, caplog) -> None:
    config = base()
    set_field(config, path)
    assert unimplemented(config) == [path]
    with caplog.at_level(logging.WARNING):
        error = ConfigSupport().check(config)
    assert error is None
    assert [r.getMessage() for r in caplog.records] == [
        f"model 'm': config field '{path}' is "
        + (
            f"ignored: {NEEDS_FLAG[path]}"
            if path in NEEDS_FLAG
            else "not implemented by inferpool and is ignored"
        )
    ]


def test_the_cache_and_the_rate_limiter_are_honoured_with_their_flags(caplog) -> None:
    config = base()
    set_field(config, "response_cache.enable")
    config.instance_group[0].rate_limiter.priority = 2
    with caplog.at_level(logging.WARNING):
        assert ConfigSupport(cache=True, rate_limit=True).check(config) is None
    assert caplog.records == []


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("sequence_batching {}", "with sequence batching scheduler"),
        ("model_transaction_policy { decoupled: true }", "with 'decoupled' transaction policy"),
    ],
)
def test_a_response_cache_triton_cannot_keep_fails_the_load(extra: str, words: str) -> None:
    config = text_format.Parse(f'name: "m" backend: "identity" {extra}', pb.ModelConfig())
    config.response_cache.enable = True
    error = ConfigSupport(cache=True).check(config)
    assert error is not None and error.code.value == "INVALID_ARG"
    assert f"Response Cache does not currently support model m {words}" in error.message


def test_an_ensembles_wiring_is_implemented(caplog) -> None:
    text = (EXAMPLES.parent / "pipeline_repository" / "probabilities" / "config.pbtxt").read_text()
    config = text_format.Parse(text, pb.ModelConfig())
    with caplog.at_level(logging.WARNING):
        assert ConfigSupport().check(config) is None
    assert caplog.records == []
