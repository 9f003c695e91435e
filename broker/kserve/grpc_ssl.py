"""The gRPC frontend over SSL/TLS, as Triton's flags ask for it.

``--grpc-use-ssl`` serves gRPC with the server's certificate chain and private key
(``--grpc-server-cert``, ``--grpc-server-key``, PEM files); ``--grpc-use-ssl-mutual`` also
asks every client for a certificate that chains to ``--grpc-root-cert`` and refuses a
client without one (it implies ``--grpc-use-ssl``).  A file that cannot be read fails the
start with one line naming its flag.
"""

from __future__ import annotations

import grpc

from inferpool.broker.kserve.frontend_options import FrontendOptions
from inferpool.wire.errors import invalid_arg


def credentials(opts: FrontendOptions) -> grpc.ServerCredentials | None:
    """The server's credentials (None: plain gRPC)."""
    mutual = opts.grpc_use_ssl_mutual
    if not (opts.grpc_use_ssl or mutual):
        return None
    chain = _read("--grpc-server-cert", opts.grpc_server_cert)
    key = _read("--grpc-server-key", opts.grpc_server_key)
    root = None
    if mutual or opts.grpc_root_cert:
        root = _read("--grpc-root-cert", opts.grpc_root_cert)
    return grpc.ssl_server_credentials([(key, chain)], root, require_client_auth=mutual)


def _read(flag: str, path: str) -> bytes:
    if not path:
        raise invalid_arg(f"gRPC over SSL needs {flag} (a PEM file)")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise invalid_arg(f"cannot read {flag} {path}: {exc.strerror or exc}") from None
