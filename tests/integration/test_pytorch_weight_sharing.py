"""ENABLE_WEIGHT_SHARING across real worker processes of one broker.

Three instances of a 32 MiB model with sharing beside one instance of it without, in one
server: the memory of the workers (psutil: USS, PSS, and the PSS of the weights mapping
itself), the region the broker created for them under the run, and its end: unloading the
model unlinks it, so does SIGTERM; after a SIGKILL of broker and workers, the next start
sweeps it.
"""

from __future__ import annotations

import os
import signal
import statistics
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch

from inferpool.backends.pytorch.weights import region_key
from inferpool.shm.runs import regions_of_run
from inferpool.shm.shared import SharedRegionTable
from tests.backends.pytorch import torch_models as tm
from tests.integration.pytorch_support import ONE_THREAD, cpu_instances, model_dir, serving
from tests.support import Server

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

N_IN, N_OUT = 1024, 8192
WEIGHTS = N_IN * N_OUT * 4  # 32 MiB
MIB = 2**20


def config(name: str, share: bool, count: int) -> str:
    sharing = f'"{str(share).lower()}"'
    return tm.config(
        [tm.inp("INPUT__0", "TYPE_FP32", [N_IN])],
        [tm.out("OUTPUT__0", "TYPE_FP32", [N_OUT])],
        max_batch_size=4,
        name=name,
        extra=f"""{cpu_instances(count)}
        {ONE_THREAD}
        parameters {{ key: "ENABLE_WEIGHT_SHARING" value: {{ string_value: {sharing} }} }}""",
    )


def layer() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(N_IN, N_OUT, bias=False)


def build(repo: Path, counts: dict[str, int]) -> None:
    for name, count in counts.items():
        model_dir(repo, name, config(name, name == "shared", count), layer())


def weights_region(server: Server, repo: Path) -> str:
    key = region_key(str(repo / "shared" / "1" / "model.pt"), "cpu")
    return SharedRegionTable(server.run_id).name_of(f"weights-{key}")


def memory(pid: int, region: str) -> tuple[int, int, int]:
    """(USS, PSS, PSS of the mapping of ``region``) of process ``pid``."""
    proc = psutil.Process(pid)
    info = proc.memory_full_info()
    mapped = sum(m.pss for m in proc.memory_maps() if m.path == f"/dev/shm/{region}")
    return info.uss, info.pss, mapped


def test_instances_share_one_copy_and_the_region_ends_with_the_model() -> None:
    x = np.random.default_rng(0).random((2, N_IN), dtype=np.float32)
    with torch.no_grad():
        expected = layer()(torch.from_numpy(x)).numpy()
    built = serving(
        lambda repo: build(repo, {"shared": 3, "private": 1}),
        *("--model-control-mode", "explicit", "--load-model", "*"),
    )
    with built as server, server.client() as c:
        region = weights_region(server, server.log_path.parent / "repo")
        run = server.run_id
        assert [n for n in regions_of_run(run) if "-weights-" in n] == [region]
        assert os.stat(f"/dev/shm/{region}").st_mode & 0o777 == 0o600
        for name in ("shared", "private"):
            out = c.infer(name, {"INPUT__0": x})["OUTPUT__0"]
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
        shared = [memory(p, region) for p in server.worker_pids("shared")]
        [(private_uss, private_pss, _)] = [memory(p, region) for p in server.worker_pids("private")]
        assert len(shared) == 3
        report = (
            f"USS shared {[u // MIB for u, _, _ in shared]} private {private_uss // MIB} MiB; "
            f"PSS of the weights mapping {[m / MIB for _, _, m in shared]} MiB"
        )
        # The three instances map one copy: its PSS adds up to one copy of the weights...
        assert 0.9 * WEIGHTS < sum(m for _, _, m in shared) < 1.1 * WEIGHTS, report
        # ...and none keeps a private one (page-table and allocator noise allowed): against an
        # instance without sharing, each holds a copy less, and three save two copies in all.
        uss_drop = private_uss - statistics.fmean(u for u, _, _ in shared)
        assert uss_drop > 0.75 * WEIGHTS, report
        pss_saved = 3 * private_pss - sum(p for _, p, _ in shared)
        assert pss_saved > 0.75 * 2 * WEIGHTS, report
        c.unload_model("shared")  # the broker unlinks the region with the model
        assert not os.path.exists(f"/dev/shm/{region}")
        c.load_model("shared")
        assert os.path.exists(f"/dev/shm/{region}")
    assert not os.path.exists(f"/dev/shm/{region}")  # SIGTERM: the run's regions go with it


def test_a_killed_run_leaves_its_weights_to_the_next_start(short_tmp: Path) -> None:
    build(short_tmp / "repo", {"shared": 1})
    first = Server(short_tmp, short_tmp / "repo")
    with first:
        region = weights_region(first, short_tmp / "repo")
        assert os.path.exists(f"/dev/shm/{region}")
        first.kill()  # SIGKILL to broker and workers alike: nobody cleans up
        # checked at once: any server starting meanwhile (other sessions too) sweeps dead runs
        assert os.path.exists(f"/dev/shm/{region}"), "a SIGKILLed run cannot clean up"
    empty = short_tmp / "empty"
    empty.mkdir()
    with Server(short_tmp, empty) as second:
        assert not os.path.exists(f"/dev/shm/{region}")
    assert second.proc.returncode == 0
    assert first.proc.returncode == -signal.SIGKILL
