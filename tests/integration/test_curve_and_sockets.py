"""Who may connect: CURVE on tcp endpoints (a client without an authorized key is refused,
quickly and clearly), and an ipc socket's directory that must be the server's own."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferpool.client import Client, InferpoolError, ShmClient
from inferpool.shm.region import Region
from tests.support import EXAMPLES, Server, serving_examples


def keygen(directory: Path, name: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "inferpool", "keygen", name, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(os.stat(directory / f"{name}.key_secret").st_mode) == 0o600


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("keys")
    for name in ("server", "client", "friend", "stranger"):
        keygen(root, name)
    authorized = root / "authorized"
    authorized.mkdir()
    for name in ("client", "friend"):
        (authorized / f"{name}.key").write_bytes((root / f"{name}.key").read_bytes())
    return root


@pytest.fixture(scope="module")
def server(keys: Path) -> Iterator[Server]:
    args = ["--curve-secret-key", str(keys / "server.key_secret")]
    args += ["--curve-authorized-keys", str(keys / "authorized")]
    yield from serving_examples(*args, tcp=True)


def refused_quickly(endpoint: str, **keys: str) -> InferpoolError:
    start = time.monotonic()
    with Client(endpoint, timeout=30, **keys) as c, pytest.raises(InferpoolError) as err:
        c.is_live()
    assert time.monotonic() - start < 10, "a refused client must not wait for its timeout"
    return err.value


def test_a_client_without_the_key_cannot_connect(server, keys) -> None:
    err = refused_quickly(server.tcp)
    assert err.code.value == "UNAVAILABLE" and "curve_server_key" in err.message, err.message
    err = refused_quickly(
        server.tcp,
        curve_server_key=str(keys / "server.key"),
        curve_secret_key=str(keys / "stranger.key_secret"),
    )
    assert "refused this client's CURVE key" in err.message, err.message


def test_an_authorized_client_is_served_and_may_register_memory(server, keys) -> None:
    x = np.arange(3, dtype=np.float32)
    creds = {
        "curve_server_key": str(keys / "server.key"),
        "curve_secret_key": str(keys / "client.key_secret"),
    }
    with Client(server.tcp, timeout=30, **creds) as c:
        np.testing.assert_array_equal(c.infer("identity", {"INPUT0": x})["OUTPUT0"], x)
    region = Region.create(f"ipt-{os.getpid()}-curve", 4096, prefault=False)
    try:
        with ShmClient(server.tcp, input_bytes=0, **creds) as c:
            c.register_system_shared_memory("mine", "/" + region.name, 4096)
            assert c.lease_status()["registrations"] == 1
    finally:
        region.destroy()
    # the command-line tools read the keys from the environment; ipc needs none
    env = {
        **os.environ,
        "INFERPOOL_CURVE_SERVER_KEY": creds["curve_server_key"],
        "INFERPOOL_CURVE_SECRET_KEY": creds["curve_secret_key"],
    }
    for endpoint in (server.tcp, server.ipc):
        done = subprocess.run(
            [sys.executable, "-m", "inferpool", "models", "--endpoint", endpoint],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert done.returncode == 0 and "identity" in done.stdout, done.stderr


def creds_of(keys: Path, name: str) -> dict[str, str]:
    return {
        "curve_server_key": str(keys / "server.key"),
        "curve_secret_key": str(keys / f"{name}.key_secret"),
    }


def test_the_output_share_is_per_curve_key_not_per_host(server, keys) -> None:
    """A CURVE client that keeps every output is refused once it holds its share; another
    key from the same host is served meanwhile (plain tcp can tell them apart by host only)."""
    mib = np.ones(1 << 18, np.float32)
    with ShmClient(server.tcp, input_bytes=2 << 20, timeout=30, **creds_of(keys, "client")) as hog:
        share = hog.lease_status()["output_share"]
        req = hog.request("identity", outputs=["OUTPUT0"])
        req.input("INPUT0", mib.shape, np.float32)[:] = mib
        kept = []
        with pytest.raises(InferpoolError) as err:
            for _ in range(2 * share >> 20):
                kept.append(hog.run(req))
        assert "--client-output-share" in err.value.message, err.value.message
        assert "CURVE key" in err.value.message, err.value.message
        with Client(server.tcp, timeout=30, **creds_of(keys, "friend")) as friend:
            for _ in range(4):
                np.testing.assert_array_equal(
                    friend.infer("identity", {"INPUT0": mib})["OUTPUT0"], mib
                )
        for result in kept:
            result.release()


def serve_error(tmp: Path, *args: str) -> str:
    """``inferpool serve`` that must refuse to start: its line of error."""
    done = subprocess.run(
        [sys.executable, "-m", "inferpool", "serve", "--model-repository", str(EXAMPLES), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp,
    )
    assert done.returncode != 0, done.stdout
    last = done.stderr.strip().splitlines()[-1]  # after the log of what the start did
    assert last.startswith("inferpool: ") and "Traceback" not in done.stderr, done.stderr
    return last


def test_an_ipc_directory_that_is_not_the_servers_own_is_refused(short_tmp) -> None:
    theirs = short_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    line = serve_error(short_tmp, "--no-prefault", "--listen", f"ipc://{theirs}/b.sock")
    assert f"{theirs} belongs to uid 65534" in line, line
    line = serve_error(short_tmp, "--no-prefault", "--listen", "ipc:///tmp/b.sock")
    assert "shared by every user" in line, line
    line = serve_error(short_tmp, "--curve-secret-key", str(short_tmp / "none"))
    assert "needs both --curve-secret-key" in line, line


def test_an_existing_ipc_directory_is_made_the_servers_alone(short_tmp) -> None:
    mine = short_tmp / "open"
    mine.mkdir()
    os.chmod(mine, 0o777)
    (short_tmp / "empty").mkdir()
    server = Server(mine, short_tmp / "empty")
    with server:
        assert stat.S_IMODE(os.stat(mine).st_mode) == 0o700
    assert server.proc.returncode == 0
