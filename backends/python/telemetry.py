"""``pb_utils.Logger`` and ``pb_utils.MetricFamily`` over Python logging and the metrics API.

Both are static in Triton (no model handle is passed), so the backend marks which model is
calling into model.py with :func:`calling`; a MetricFamily belongs to that model.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
from collections.abc import Iterator

from inferpool.backends.api import Metric, Model
from inferpool.backends.python.tensor import TritonModelException

log = logging.getLogger("inferpool.backend.python")

_calling: contextvars.ContextVar[Model] = contextvars.ContextVar("pb_utils_model")


@contextlib.contextmanager
def calling(model: Model) -> Iterator[None]:
    """Run model.py code with ``model`` as the owner of the metrics it creates."""
    token = _calling.set(model)
    try:
        yield
    finally:
        _calling.reset(token)


class LogLevel(enum.IntEnum):
    """pb_utils.Logger's levels, as Triton names them."""

    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


class Logger:
    """Static logging calls; records point at the model.py line that logged."""

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        log.log(int(level), message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        log.info(message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        log.warning(message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        log.error(message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        log.debug(message, stacklevel=2)


class MetricFamily:
    """A custom counter or gauge of the calling model (create it in initialize())."""

    COUNTER = "counter"
    GAUGE = "gauge"

    def __init__(self, name: str, description: str, kind: str) -> None:
        model = _calling.get(None)
        if model is None:
            raise TritonModelException(
                f"MetricFamily '{name}' must be created inside initialize(), execute() or "
                "finalize() of the model, on the thread that called it"
            )
        if kind not in (self.COUNTER, self.GAUGE):
            raise TritonModelException(
                f"MetricFamily '{name}': kind must be MetricFamily.COUNTER or .GAUGE "
                "(histograms are not supported)"
            )
        self._family = model.metric_family(name, description, kind)

    def Metric(self, labels: dict[str, str] | None = None) -> _Metric:  # pb_utils' spelling
        return _Metric(self._family.metric(**(labels or {})))


class _Metric:
    """One labelled metric; ``value()`` is what this process has recorded."""

    def __init__(self, metric: Metric) -> None:
        self._metric = metric
        self._value = 0.0

    def increment(self, value: float) -> None:
        self._metric.increment(value)
        self._value += value

    def set(self, value: float) -> None:
        self._metric.set(value)
        self._value = value

    def value(self) -> float:
        return self._value
