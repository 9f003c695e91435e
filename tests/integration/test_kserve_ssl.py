"""gRPC over SSL/TLS with Triton's flags, with tritonclient's SSL options and certificates the
test makes with openssl: a certificate authority, the server's certificate (for localhost and
127.0.0.1) and a client's."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support import EXAMPLES, Server, run_cli

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="the test makes its certificates with openssl"
)


def openssl(where: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True, timeout=60)


def certificates(where: Path) -> dict[str, Path]:
    """ca.crt, and server.crt / server.key and client.crt / client.key signed by it (EC keys:
    quick to make)."""
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl(where, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=inferpool test CA")  # fmt: skip
    (where / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name, extra in (("server", ("-extfile", "san.cnf")), ("client", ())):
        openssl(where, "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=inferpool test {name}")  # fmt: skip
        openssl(where, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "1", *extra)  # fmt: skip
    return {
        name: where / name
        for name in ("ca.crt", "server.crt", "server.key", "client.crt", "client.key")
    }


def serve(tmp: Path, certs: dict[str, Path], *flags: str) -> Server:
    return Server(
        tmp,
        EXAMPLES,
        "--grpc-server-cert",
        str(certs["server.crt"]),
        "--grpc-server-key",
        str(certs["server.key"]),
        *flags,
        kserve=True,
    )


def infer(client: grpcclient.InferenceServerClient) -> list[float]:
    tensor = grpcclient.InferInput("INPUT0", [3], "FP32")
    tensor.set_data_from_numpy(np.arange(3, dtype=np.float32))
    return client.infer("identity", [tensor]).as_numpy("OUTPUT0").tolist()


def test_ssl_serves_clients_that_trust_the_servers_certificate(short_tmp: Path) -> None:
    certs = certificates(short_tmp)
    with serve(short_tmp, certs, "--grpc-use-ssl", "true") as server:
        host = f"localhost:{server.grpc_port}"
        secure = grpcclient.InferenceServerClient(
            host, ssl=True, root_certificates=str(certs["ca.crt"])
        )
        assert infer(secure) == [0, 1, 2]
        assert f"KServe gRPC on 127.0.0.1:{server.grpc_port} (SSL)\n" in server.log()
        plain = grpcclient.InferenceServerClient(host)  # not SSL: the handshake fails
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=10)
        strange = grpcclient.InferenceServerClient(  # a CA the server's certificate is not of
            host, ssl=True, root_certificates=str(certs["client.crt"])
        )
        with pytest.raises(InferenceServerException):
            strange.is_server_live(client_timeout=10)


def test_mutual_ssl_serves_only_clients_with_a_certificate(short_tmp: Path) -> None:
    certs = certificates(short_tmp)
    mutual = ("--grpc-use-ssl-mutual", "true", "--grpc-root-cert", str(certs["ca.crt"]))
    with serve(short_tmp, certs, *mutual) as server:
        host = f"localhost:{server.grpc_port}"
        client = grpcclient.InferenceServerClient(
            host,
            ssl=True,
            root_certificates=str(certs["ca.crt"]),
            private_key=str(certs["client.key"]),
            certificate_chain=str(certs["client.crt"]),
        )
        assert infer(client) == [0, 1, 2] and client.is_server_ready()
        required = (
            f"KServe gRPC on 127.0.0.1:{server.grpc_port} (SSL, clients' certificates required)"
        )
        assert required + "\n" in server.log()
        anonymous = grpcclient.InferenceServerClient(
            host, ssl=True, root_certificates=str(certs["ca.crt"])
        )
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live(client_timeout=10)


@pytest.mark.parametrize(
    "flags, says",
    [
        (
            ("--grpc-use-ssl", "true"),
            "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key",
        ),
        (
            ("--grpc-use-ssl-mutual", "true", "--grpc-server-cert", "x", "--grpc-server-key", "y"),
            "--grpc-use-ssl-mutual needs --grpc-root-cert (the clients' CA)",
        ),
    ],
)
def test_ssl_flags_that_cannot_work_are_one_line(flags: tuple[str, ...], says: str) -> None:
    status, out, err = run_cli("serve", *flags)
    assert status == 2 and err.strip() == f"inferpool: {says}" and out == ""


def test_a_certificate_that_cannot_be_read_fails_the_start_naming_it(short_tmp: Path) -> None:
    missing = {"server.crt": short_tmp / "none.crt", "server.key": short_tmp / "none.key"}
    server = serve(short_tmp, missing, "--grpc-use-ssl", "true")
    assert server.proc.wait(60) == 1
    last = server.log().strip().splitlines()[-1]
    assert (
        last.startswith("inferpool: ")
        and f"cannot read --grpc-server-cert {missing['server.crt']}: No such file" in last
    )
