"""Which errors make the CLI ask the server for its models: only a model it does not know
(a server that does not answer is not asked a second time, which would double the wait)."""

from __future__ import annotations

from inferpool.usage import is_unknown_model, unknown_model
from inferpool.wire.errors import Code, InferpoolError


def test_only_an_unknown_model_asks_for_the_names() -> None:
    missing = InferpoolError(Code.NOT_FOUND, "unknown model: 'idenity' is not found")
    assert is_unknown_model(missing, "idenity")
    assert not is_unknown_model(missing, "other")
    gone = InferpoolError(Code.UNAVAILABLE, "no inferpool server answers at tcp://127.0.0.1:1")
    assert not is_unknown_model(gone, "idenity")
    version = InferpoolError(Code.NOT_FOUND, "request for unknown model: 'identity' version 9")
    assert not is_unknown_model(version, "identity")


def test_the_names_come_nearest_first() -> None:
    missing = InferpoolError(Code.NOT_FOUND, "unknown model: 'idenity' is not found")
    err = unknown_model(missing, "idenity", ["square", "identity", "identity"])
    assert err.code is Code.NOT_FOUND
    assert err.message.endswith("; did you mean 'identity'? (the server has: identity, square)")
