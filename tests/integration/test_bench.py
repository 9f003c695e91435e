"""``inferpool bench`` against a live broker: its JSON, CSV and PNG are well formed, and what
it counts is what the statistics API counts for the same window."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferpool.bench.results import CSV_HEADER
from tests.support import EXAMPLES, Server, copy_models, run_cli, serving

MODELS = ("identity", "identity_batched", "square_int32")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    yield from serving(lambda tmp: copy_models(tmp, EXAMPLES, *MODELS), kserve=True)


def successes(server: Server, model: str) -> int:
    with server.client() as c:
        [stats] = c.statistics(model)["model_stats"]
    return int(stats["inference_stats"]["success"]["count"])


def test_json_csv_and_png_and_counts_that_match_the_server(server: Server, short_tmp: Path) -> None:
    out = {kind: short_tmp / f"bench.{kind}" for kind in ("json", "csv", "png")}
    before = successes(server, "identity")
    status, stdout, err = run_cli(
        "bench",
        "identity",
        "--endpoint",
        server.endpoint,
        "--concurrency",
        "1,4",
        "--requests",
        "60",
        "--warmup",
        "0",
        "--shape",
        "INPUT0:16",
        "--json",
        str(out["json"]),
        "--csv",
        str(out["csv"]),
        "--plot",
        str(out["png"]),
        "--quiet",
    )
    assert status == 0, err
    assert "client side" in stdout and "server side, same window" in stdout
    assert successes(server, "identity") - before == 120  # no warm-up: every request counted

    report = json.loads(out["json"].read_text())
    assert (report["model"], report["version"], report["transport"]) == ("identity", "1", "zmq")
    assert report["inputs"] == {"INPUT0": {"datatype": "FP32", "shape": [16]}}
    levels = report["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    for lv in levels:
        assert lv["requests"] == lv["server"]["requests"] == 60 and lv["errors"] == 0
        assert lv["server"]["failures"] == 0 and lv["server"]["executions"] == 60
        p = lv["latencies_us"]
        assert 0 < lv["min_us"] <= p["p50"] <= p["p90"] <= p["p95"] <= p["p99"] <= lv["max_us"]
        assert all(round(v, 1) == v for v in (*p.values(), lv["avg_us"], lv["max_us"]))
        assert lv["requests_per_second"] > 0 and lv["seconds"] > 0
        server_side = lv["server"]
        assert 0 < server_side["compute_infer_us"] < server_side["request_us"]

    rows = list(csv.reader(out["csv"].open()))
    assert tuple(rows[0]) == CSV_HEADER and len(rows) == 3
    for row, lv in zip(rows[1:], levels, strict=True):
        record = dict(zip(CSV_HEADER, row, strict=True))
        assert int(record["Concurrency"]) == lv["concurrency"]
        assert int(record["Client Requests"]) == int(record["Server Requests"]) == 60
        assert float(record["Requests/Second"]) > 0 and int(record["p99 latency"]) > 0

    png = out["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(str(out["png"])).shape
    assert width > 600 and height > 300


def test_shm_batches_and_a_timed_window_with_warm_up(server: Server, short_tmp: Path) -> None:
    path = short_tmp / "bench.json"
    status, _, err = run_cli(
        "bench",
        "identity_batched",
        "--endpoint",
        server.endpoint,
        "--transport",
        "shm",
        "--batch-size",
        "2",
        "--shape",
        "INPUT0:8",
        "--input-data",
        "zero",
        "--concurrency",
        "2",
        "--duration",
        "0.5",
        "--warmup",
        "0.2",
        "--json",
        str(path),
        "--quiet",
    )
    assert status == 0, err
    report = json.loads(path.read_text())
    [level] = report["levels"]
    assert report["inputs"] == {"INPUT0": {"datatype": "INT32", "shape": [2, 8]}}
    assert level["requests"] == level["server"]["requests"] > 0  # the warm-up is not counted
    assert level["server"]["inferences"] == 2 * level["requests"]
    # both are rounded to 0.1 in the report: twice the one may differ from the other by 0.15
    assert level["inferences_per_second"] == pytest.approx(
        2 * level["requests_per_second"], abs=0.15
    )


def test_a_decoupled_model_is_timed_to_its_final_response(server: Server, short_tmp: Path) -> None:
    data = short_tmp / "in.json"
    data.write_text('{"IN": [3]}')
    path = short_tmp / "bench.json"
    status, _, err = run_cli(
        "bench",
        "square_int32",
        "--endpoint",
        server.endpoint,
        "--input-data",
        str(data),
        "--requests",
        "20",
        "--warmup",
        "0",
        "--json",
        str(path),
        "--quiet",
    )
    assert status == 0, err
    [level] = json.loads(path.read_text())["levels"]
    assert level["requests"] == level["server"]["requests"] == 20


@pytest.mark.parametrize("transport", ["http", "grpc", "lane"])
def test_other_transports_count_what_the_server_counts(
    server: Server, short_tmp: Path, transport: str
) -> None:
    path = short_tmp / "bench.json"
    url = {"http": server.http_url, "grpc": server.grpc_url}.get(transport, "")
    before = successes(server, "identity")
    status, out, err = run_cli(
        "bench",
        "identity",
        "--endpoint",
        server.endpoint,
        "--transport",
        transport,
        *(["--url", url] if url else []),
        "--shape",
        "INPUT0:16",
        "--concurrency",
        "1,3",
        "--requests",
        "30",
        "--warmup",
        "0",
        "--json",
        str(path),
        "--quiet",
    )
    assert status == 0, err
    assert successes(server, "identity") - before == 60
    report = json.loads(path.read_text())
    assert report["transport"] == transport
    for level in report["levels"]:
        assert level["requests"] == level["server"]["requests"] == 30 and level["errors"] == 0
    if transport == "lane":  # how its waits went, and where its two ends ran
        lane = report["lane"]
        assert lane["spun"] + lane["slept"] > 0
        assert lane["waits"] in ("spin", "sleep", "spin and sleep")
        assert lane["client_core"] in lane["client_cores"] and lane["worker_cores"]
        assert f"lane: waits {lane['waits']} ({lane['spun']} answered spinning" in out
    else:
        assert "lane" not in report


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["identity"], "has variable dims [-1]: give its shape with --shape INPUT0:DIMS"),
        (["identity", "--shape", "X:3"], "--shape names ['X'], not inputs of model"),
        (["identity", "--shape", "INPUT0"], "--shape expects NAME:DIMS"),
        (["square_int32", "--transport", "shm"], "--transport shm sends to models that answer"),
        (["square_int32", "--transport", "grpc"], "--transport grpc sends to models that answer"),
        (
            ["identity_batched", "--shape", "INPUT0:4", "--transport", "lane"],
            "UNSUPPORTED: ",
        ),
        (
            ["identity", "--shape", "INPUT0:4", "--transport", "http", "--url", "127.0.0.1:1"],
            "UNAVAILABLE: no KServe HTTP server answers at 127.0.0.1:1",
        ),
        (["identity", "--shape", "INPUT0:4", "--batch-size", "2"], "does not batch"),
        (["identity", "--shape", "INPUT0:4", "--input-data", "/none"], "neither random, zero"),
        (["identity", "--concurrency", "0"], "expected counts such as 1,4,16"),
        (["nosuch"], "NOT_FOUND"),
    ],
)
def test_mistakes_are_one_line(server: Server, argv: list[str], says: str) -> None:
    status, out, err = run_cli("bench", *argv, "--endpoint", server.endpoint, "--quiet")
    assert status == 2 and out == "" and says in err.splitlines()[-1], err


def test_plot_without_matplotlib_is_refused_before_anything_runs(
    short_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No server at the endpoint: the check comes before the benchmark would connect."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    endpoint = f"ipc://{short_tmp}/nobody.sock"
    status, stdout, err = run_cli("bench", "identity", "--endpoint", endpoint, "--plot", "x.png")
    assert (status, stdout) == (2, "")
    assert err == "inferpool: --plot needs matplotlib: pip install 'inferpool[plot]'\n"
