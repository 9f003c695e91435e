"""The one error type of inferpool, with Triton's error codes.

Every failure that crosses a process boundary (worker -> broker -> client) travels as
``{"code": ..., "message": ...}`` and comes back out as the same typed exception, never
as a traceback string.
"""

from __future__ import annotations

import enum
from typing import Any


class Code(str, enum.Enum):
    """Triton's TRITONSERVER_Error codes plus TIMEOUT."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"


# Triton's TRITONSERVER_Error_Code numbers: the code of each (pb_utils.TritonError's numbers,
# a C backend's errors)
TRITON_CODES = (
    Code.UNKNOWN,
    Code.INTERNAL,
    Code.NOT_FOUND,
    Code.INVALID_ARG,
    Code.UNAVAILABLE,
    Code.UNSUPPORTED,
    Code.ALREADY_EXISTS,
    Code.CANCELLED,
)

# Triton's HTTP status for each code (its HttpCodeFromError); a queue timeout (TIMEOUT,
# inferpool's own code) is 503: the KServe frontend and the Ray Serve adapter answer with these
HTTP_STATUS = {
    Code.UNKNOWN: 400,
    Code.INTERNAL: 500,
    Code.NOT_FOUND: 404,
    Code.INVALID_ARG: 400,
    Code.UNAVAILABLE: 503,
    Code.UNSUPPORTED: 501,
    Code.ALREADY_EXISTS: 400,
    Code.CANCELLED: 400,
    Code.TIMEOUT: 503,
}


class InferpoolError(Exception):
    """An error with a Triton code; ``str(err)`` reads like Triton's ``Code: message``."""

    def __init__(self, code: Code | str, message: str) -> None:
        try:
            self.code = Code(code)
        except ValueError:
            self.code = Code.UNKNOWN
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"

    def __repr__(self) -> str:
        return f"InferpoolError({self.code.value!r}, {self.message!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, InferpoolError)
            and self.code == other.code
            and self.message == other.message
        )

    def __hash__(self) -> int:
        return hash((self.code, self.message))

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message}

    @classmethod
    def from_wire(cls, obj: Any) -> InferpoolError:
        if not isinstance(obj, dict):
            return cls(Code.INTERNAL, f"malformed error object: {obj!r}")
        return cls(str(obj.get("code", "UNKNOWN")), str(obj.get("message", "")))

    @classmethod
    def wrap(
        cls, exc: BaseException, code: Code = Code.INTERNAL, prefix: str = ""
    ) -> InferpoolError:
        """An InferpoolError for any exception, keeping its code if it already has one."""
        if isinstance(exc, InferpoolError):
            if not prefix:
                return exc
            return cls(exc.code, prefix + exc.message)
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return cls(code, prefix + detail)


def invalid_arg(message: str) -> InferpoolError:
    """An INVALID_ARG error."""
    return InferpoolError(Code.INVALID_ARG, message)


def not_found(message: str) -> InferpoolError:
    """A NOT_FOUND error."""
    return InferpoolError(Code.NOT_FOUND, message)


def unavailable(message: str) -> InferpoolError:
    """An UNAVAILABLE error."""
    return InferpoolError(Code.UNAVAILABLE, message)


def unsupported(message: str) -> InferpoolError:
    """An UNSUPPORTED error."""
    return InferpoolError(Code.UNSUPPORTED, message)


def internal(message: str) -> InferpoolError:
    """An INTERNAL error."""
    return InferpoolError(Code.INTERNAL, message)
