"""An ensemble's life with its composing models, under explicit model control, as in Triton:
loading the ensemble loads them; unloading one makes the ensemble unavailable until it is
loaded again; reloading one with a configuration that no longer fits makes the ensemble
unavailable with the reason, and fixing it brings the ensemble back; unloading the ensemble
leaves its composing models serving."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferpool.client import Client, Code, InferpoolError
from tests.support import identity_config, serving, wait_until, write_model

PAIR = """
    name: "pair"
    platform: "ensemble"
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
    ensemble_scheduling { step [
      { model_name: "first" input_map { key: "INPUT0" value: "IN" }
        output_map { key: "OUTPUT0" value: "between" } },
      { model_name: "second" input_map { key: "INPUT0" value: "between" }
        output_map { key: "OUTPUT0" value: "OUT" } }
    ] }
"""


def repo(tmp: Path) -> Path:
    root = tmp / "repo"
    write_model(root, "first", identity_config("first", dims="[ 4 ]"))
    write_model(root, "second", identity_config("second", dims="[ 4 ]"))
    write_model(root, "solo", identity_config("solo", dims="[ 4 ]"))
    write_model(root, "pair", PAIR)
    return root


@pytest.fixture(scope="module")
def server():
    yield from serving(repo, "--model-control-mode", "explicit", "--load-model", "pair")


def states(c: Client) -> dict[str, tuple[str, str]]:
    return {m["name"]: (m["state"], m["reason"]) for m in c.models()}


def infer_pair(c: Client) -> np.ndarray:
    x = np.arange(4, dtype=np.float32)
    return c.infer("pair", {"IN": x})["OUT"]


def test_loading_an_ensemble_loads_its_composing_models(server) -> None:
    with server.client() as c:
        rows = states(c)
        assert {name: state for name, (state, _) in rows.items()} == {
            "first": "READY",
            "second": "READY",
            "pair": "READY",
            "solo": "",  # in the repository, never loaded
        }
        assert infer_pair(c).tolist() == [0, 1, 2, 3]


def test_unloading_a_composing_model_makes_the_ensemble_unavailable(server) -> None:
    with server.client() as c:
        c.unload_model("second")
        wait_until(lambda: states(c)["pair"][0] == "UNAVAILABLE", what="pair unavailable")
        assert states(c)["pair"][1] == (
            "ensemble 'pair' depends on 'second' which has no loaded version."
        )
        assert not c.is_model_ready("pair")
        with pytest.raises(InferpoolError) as err:
            infer_pair(c)
        assert err.value.code is Code.UNAVAILABLE and "no loaded version" in err.value.message
        c.load_model("second")
        wait_until(lambda: states(c)["pair"] == ("READY", ""), what="pair ready again")
        assert infer_pair(c).tolist() == [0, 1, 2, 3]


def test_a_composing_model_reloaded_unfit_and_fixed(server) -> None:
    root = Path(server.proc.args[server.proc.args.index("--model-repository") + 1])
    with server.client() as c:
        write_model(root, "second", identity_config("second", dims="[ 8 ]"))
        c.load_model("second")
        wait_until(lambda: states(c)["pair"][0] == "UNAVAILABLE", what="pair unavailable")
        assert (
            "in ensemble pair, ensemble tensor between: inconsistent shape: [4] is inferred "
            "from model first while [8] is inferred from model second" in states(c)["pair"][1]
        )
        write_model(root, "second", identity_config("second", dims="[ -1 ]"))
        c.load_model("second")
        wait_until(lambda: states(c)["pair"] == ("READY", ""), what="pair ready again")
        assert infer_pair(c).tolist() == [0, 1, 2, 3]


def test_unloading_the_ensemble_leaves_its_models_serving(server) -> None:
    with server.client() as c:
        c.unload_model("pair")
        wait_until(lambda: states(c)["pair"] == ("UNAVAILABLE", "unloaded"), what="pair unloaded")
        assert states(c)["first"][0] == states(c)["second"][0] == "READY"
        x = np.ones(4, np.float32)
        assert c.infer("first", {"INPUT0": x})["OUTPUT0"].tolist() == [1] * 4
