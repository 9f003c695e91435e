"""inferpool.broker.models.core_defaults: what Triton's core adds to every config."""

from __future__ import annotations

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models.core_defaults import add_core_defaults


def completed(text: str) -> pb.ModelConfig:
    config = text_format.Parse(text, pb.ModelConfig())
    add_core_defaults(config)
    return config


def test_preferred_sizes_idle_time_and_pinned_memory_as_tritons_core_adds_them() -> None:
    dyn = completed('name: "d" max_batch_size: 8 dynamic_batching { }')
    assert list(dyn.dynamic_batching.preferred_batch_size) == [8]
    assert dyn.optimization.input_pinned_memory.enable
    assert dyn.optimization.output_pinned_memory.enable
    seq = completed('name: "s" max_batch_size: 4 sequence_batching { oldest { } }')
    assert seq.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(seq.sequence_batching.oldest.preferred_batch_size) == [4]


def test_what_the_config_sets_stays_and_twice_is_once() -> None:
    text = """name: "m" max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 2, 4 ] }
        optimization { input_pinned_memory { enable: false } }"""
    config = completed(text)
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4]
    assert not config.optimization.input_pinned_memory.enable
    idle = completed('name: "s" sequence_batching { max_sequence_idle_microseconds: 5 }')
    assert idle.sequence_batching.max_sequence_idle_microseconds == 5
    again = pb.ModelConfig()
    again.CopyFrom(config)
    add_core_defaults(again)
    assert again == config


def test_no_batch_no_preferred_size_and_an_ensemble_gets_no_pinned_flags() -> None:
    assert not completed('name: "n" dynamic_batching { }').dynamic_batching.preferred_batch_size
    ensemble = completed('name: "e" platform: "ensemble" ensemble_scheduling { }')
    assert not ensemble.HasField("optimization")
