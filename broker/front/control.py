"""Every client message but ``infer``, ``drain`` and the shared-memory extension's: health,
metadata, the repository index, explicit model control, statistics and the instances' status.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from inferpool import __version__
from inferpool.broker.front.readiness import Readiness
from inferpool.broker.front.responder import Responder
from inferpool.broker.front.router import Handler
from inferpool.broker.models import overrides
from inferpool.broker.models.index import repository_index
from inferpool.broker.models.lifecycle import ModelLifecycle
from inferpool.broker.models.registry import Registry, State
from inferpool.broker.models.reload import Waiter
from inferpool.broker.models.repository import poll_failure
from inferpool.broker.models.stats import memory_usage
from inferpool.broker.pool.supervisor import Supervisor
from inferpool.shm.arena import Arena
from inferpool.wire import codec
from inferpool.wire.errors import Code, InferpoolError, invalid_arg

EXTENSIONS = ("model_repository", "statistics", "sequence", "binary_tensor_data", "parameters")


class Control:
    """The control messages: health, metadata, the repository index, load and unload, statistics,
    status."""

    def __init__(
        self,
        *,
        readiness: Readiness,
        registry: Registry,
        lifecycle: ModelLifecycle,
        supervisor: Supervisor[Any],
        responder: Responder,
        arena: Arena,
        run_id: str,
        name: str,
        extensions: Sequence[str],
        explicit: bool,
        resources: Callable[[], dict[str, int]],
    ) -> None:
        """``name``: the server's (Triton's --id); ``extensions``: those of the other parts
        (shared memory, logging); ``explicit``: models load
        and unload on request (``--model-control-mode explicit``); ``resources``: what the
        broker holds for clients and requests right now (counts, for ``statistics``)."""
        self.resources = resources
        self.readiness = readiness
        self.registry = registry
        self.lifecycle = lifecycle
        self.supervisor = supervisor
        self.responder = responder
        self.arena = arena
        self.explicit = explicit
        self.metadata = {
            "name": name,
            "version": __version__,
            "protocol": codec.PROTOCOL_VERSION,
            "extensions": [*EXTENSIONS, *extensions],
            "run_id": run_id,  # every shared-memory region of this run: inferpool-<run_id>-*
        }

    def handlers(self) -> dict[str, Handler]:
        return {
            "health_live": lambda e, h, f: {"live": True},
            "health_ready": self.health_ready,
            "server_metadata": lambda e, h, f: dict(self.metadata),
            "model_ready": self.model_ready,
            "model_metadata": self.model_metadata,
            "model_config": self.model_config,
            "model_labels": self.model_labels,
            "repository_index": self.repository_index,
            "load": self.load,
            "unload": self.unload,
            "statistics": self.statistics,
            "status": self.status,
        }

    def health_ready(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        why = self.readiness.why_not()
        return {"ready": not why, "reason": why}

    # ------------------------------------------------------------------ metadata
    def model_ready(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        try:
            self.registry.resolve(h.get("model_name"), h.get("model_version"))
        except InferpoolError as err:
            if err.code is Code.UNAVAILABLE:
                return {"ready": False}
            raise
        return {"ready": True}

    def model_metadata(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        mv = self.registry.resolve(h.get("model_name"), h.get("model_version"))
        record = self.registry.records[mv.name]
        meta = mv.metadata()
        meta["versions"] = [v.version_str for v in record.ready_versions()]
        return meta

    def model_config(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        mv = self.registry.resolve(h.get("model_name"), h.get("model_version"))
        return {"config": mv.config_dict()}

    def model_labels(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        """Its outputs' labels (models.labels) and whether it batches, for classification;
        the labels are left out when ``serial`` says the caller has them already."""
        mv = self.registry.resolve(h.get("model_name"), h.get("model_version"))
        labels = mv.labels
        reply: dict[str, Any] = {
            "model_version": mv.version_str,
            "max_batch_size": mv.max_batch_size,
            "serial": labels.serial,
        }
        if h.get("serial") != labels.serial:
            reply["labels"] = labels.by_output
        return reply

    def repository_index(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        ready = bool(h.get("ready", False))
        return {"models": repository_index(self.registry, self.lifecycle.repository, ready)}

    def statistics(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        name = h.get("model_name") or ""
        if name:
            versions = [self.registry.resolve(name, h.get("model_version"))]
        else:
            versions = [mv for mv in self.registry.all_versions() if mv.state is State.READY]
        return {
            "model_stats": [
                mv.stats.to_dict(mv.name, mv.version, memory_usage(mv.instances)) for mv in versions
            ],
            "custom_metrics": self.lifecycle.requests.metrics.to_list(name or None),
            "arena": {"size": self.arena.size, "free": self.arena.free_bytes},
            "inflight": len(self.lifecycle.requests.inflight),
            "resources": self.resources(),
        }

    def status(self, e: list[bytes], h: dict[str, Any], f: list[Any]) -> dict[str, Any]:
        return {"instances": [hd.status() for hd in self.supervisor.handles.values()]}

    # ------------------------------------------------------------------ model control
    def _model_name(self, what: str, h: dict[str, Any]) -> str:
        if not self.explicit:  # Triton's wording, for its modes none and poll alike
            raise InferpoolError(
                Code.UNAVAILABLE,
                "explicit model load / unload is not allowed if polling is enabled (the "
                "server must run with --model-control-mode explicit)",
            )
        name = h.get("model_name")
        if not isinstance(name, str) or not name:
            raise invalid_arg(f"{what} needs a model_name")
        if "/" in name or name.startswith(".") or "\0" in name:
            raise invalid_arg(
                f"invalid model name {name!r}: a model is a directory of the repository (no "
                "'/', not starting with '.')"
            )
        return name

    def load(self, envelope: list[bytes], h: dict[str, Any], f: list[Any]) -> None:
        """Load (or reload) a model; ``parameters`` may override its config and files."""
        name = self._model_name("load", h)
        try:
            override = overrides.parse(h.get("parameters"), f)
        except InferpoolError as err:
            raise poll_failure(name, err) from None
        self.lifecycle.load(name, self._deferred(envelope, "load", h.get("id", "")), override)

    def unload(self, envelope: list[bytes], h: dict[str, Any], f: list[Any]) -> None:
        name = self._model_name("unload", h)
        self.lifecycle.unload(name, self._deferred(envelope, "unload", h.get("id", "")))

    def _deferred(self, envelope: list[bytes], msg_type: str, request_id: Any) -> Waiter:
        def done(err: InferpoolError | None) -> None:
            if err is None:
                self.responder.send(envelope, {"type": msg_type, "id": request_id})
            else:
                self.responder.send_error(envelope, msg_type, request_id, err)

        return done
