"""inferpool.broker.models.completion: which completed configs a model version serves, and which it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferpool.broker.models.completion import adopt
from inferpool.broker.models.config import load_config, to_dict
from inferpool.broker.models.core_defaults import add_core_defaults
from inferpool.broker.models.registry import ModelVersion
from inferpool.broker.pool.instance_groups import complete_groups
from inferpool.wire.errors import Code, InferpoolError
from tests.support import write_model


@pytest.fixture
def version(tmp_path: Path) -> ModelVersion:
    """A python model whose config.pbtxt leaves inputs and outputs to the backend, as Triton
    allows: the repository loader accepts it."""
    write_model(tmp_path, "m", 'backend: "python" instance_group [ { count: 2 } ]')
    config = load_config(str(tmp_path / "m"))
    assert not config.input and not config.output
    add_core_defaults(config)  # as the lifecycle gives it to its workers
    complete_groups(config, ())
    return ModelVersion("m", 1, config, str(tmp_path / "m"))


def completed(mv: ModelVersion, **changes: Any) -> dict[str, Any]:
    config = to_dict(mv.repository_config)
    config.update(changes)
    return config


IO = {
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": ["4"]}],
    "max_batch_size": 8,
}


def test_first_report_is_served_and_later_ones_must_match(version: ModelVersion) -> None:
    assert adopt(version, completed(version, **IO), "m_0_0") is True
    assert version.completed_by == "m_0_0"
    assert set(version.inputs) == {"X"} and version.max_batch_size == 8
    assert version.metadata()["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    assert adopt(version, completed(version, **IO), "m_0_1") is False  # same: nothing to do
    with pytest.raises(InferpoolError) as err:
        adopt(version, completed(version, **{**IO, "max_batch_size": 4}), "m_0_1")
    assert err.value.code is Code.INVALID_ARG
    assert err.value.message.startswith(
        "instances 'm_0_0' and 'm_0_1' of model 'm' version 1 completed the configuration "
        "differently (they differ in max_batch_size)"
    )


def test_an_unchanged_config_is_served_as_it_is(version: ModelVersion) -> None:
    config = version.config
    assert adopt(version, to_dict(config), "m_0_0") is False
    assert adopt(version, None, "m_0_1") is False  # a worker that reports nothing
    assert version.config is config


def test_the_completed_config_is_validated(version: ModelVersion) -> None:
    bad = completed(version, input=[{"name": "X", "data_type": "TYPE_FP32", "dims": ["0"]}])
    with pytest.raises(InferpoolError, match=r"input 'X' has invalid dims \[0\]") as err:
        adopt(version, bad, "m_0_0")
    assert "config.pbtxt as completed by backend 'python'" in err.value.message
    assert version.completed_by == "" and not version.inputs


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"backend": "identity"}, "backend"),
        ({"instance_group": [{"count": 3, "kind": "KIND_CPU"}]}, "instance_group"),
        ({"version_policy": {"all": {}}}, "version_policy"),
    ],
)
def test_fields_acted_upon_before_load_cannot_change(
    version: ModelVersion, changes: dict[str, Any], field: str
) -> None:
    with pytest.raises(InferpoolError) as err:
        adopt(version, completed(version, **changes), "m_0_0")
    assert f"instance 'm_0_0' of model 'm' version 1 changed {field} while completing" in (
        err.value.message
    )


def test_an_unreadable_report_is_internal(version: ModelVersion) -> None:
    with pytest.raises(InferpoolError) as err:
        adopt(version, {"max_batch_size": "many"}, "m_0_0")
    assert err.value.code is Code.INTERNAL
    assert "instance 'm_0_0' of model 'm' version 1 reported an unreadable configuration" in (
        err.value.message
    )
