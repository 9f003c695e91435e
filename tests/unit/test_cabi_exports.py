"""The C API host exports every function the project's headers declare for a backend to
import, and each one it does not implement answers TRITONSERVER_ERROR_UNSUPPORTED naming
itself."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import pytest

from inferpool.backends.cabi import library
from inferpool.wire.errors import Code, InferpoolError

HEADERS = Path(library.include_dir()) / "triton" / "core"
DECLARED = re.compile(r"^(?:TRITONSERVER_DECLSPEC|TRITONBACKEND_DECLSPEC) .+? (\w+)\(", re.M)
UNSUPPORTED = 5  # TRITONSERVER_ERROR_UNSUPPORTED


@pytest.fixture(scope="module")
def host() -> ctypes.CDLL:
    try:
        module = library.host()
    except InferpoolError as err:
        pytest.skip(f"the C API host is not built: {err.message}")
    return ctypes.CDLL(module.__file__)


def declared() -> list[str]:
    names = []
    for header in ("tritonserver.h", "tritonbackend.h"):
        names += DECLARED.findall((HEADERS / header).read_text())
    return names


def test_every_declared_function_is_exported(host: ctypes.CDLL) -> None:
    names = declared()
    assert len(names) > 250  # Triton's API: 1.19 backend, 1.34 server
    missing = [n for n in names if not hasattr(host, n)]
    assert missing == []


def test_an_unimplemented_function_answers_unsupported_with_its_name(host: ctypes.CDLL) -> None:
    generated = (Path(library.__file__).parent / "host" / "unsupported.c").read_text()
    assert "TRITONSERVER_ServerNew(" in generated
    new = host.TRITONSERVER_ServerNew
    new.restype = ctypes.c_void_p
    error = new(None, None)
    assert error
    host.TRITONSERVER_ErrorCode.restype = ctypes.c_int
    host.TRITONSERVER_ErrorMessage.restype = ctypes.c_char_p
    assert host.TRITONSERVER_ErrorCode(ctypes.c_void_p(error)) == UNSUPPORTED
    message = host.TRITONSERVER_ErrorMessage(ctypes.c_void_p(error)).decode()
    assert message == "TRITONSERVER_ServerNew is not supported by inferpool"
    host.TRITONSERVER_ErrorDelete(ctypes.c_void_p(error))


def test_without_the_host_a_c_backend_fails_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a machine without a C compiler gets (pip install builds no host there)."""
    library.host.cache_clear()
    monkeypatch.setattr(library, "HOST_MODULE", "inferpool.backends.cabi._never_built")
    try:
        with pytest.raises(InferpoolError) as err:
            library.host()
    finally:
        library.host.cache_clear()
    assert err.value.code == Code.UNAVAILABLE
    assert "\n" not in err.value.message
    assert err.value.message.endswith(
        "install a C compiler (apt-get install gcc), then reinstall inferpool"
    )
