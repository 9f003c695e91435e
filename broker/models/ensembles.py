"""The ensembles the lifecycle serves, and their readiness as their composing models come and go.

As in Triton, an ensemble is ready only while every model its steps name has the version
the step asks for ready, and only once their served configurations fit its wiring
(``ensemble_config.check_composing``).  Loading an ensemble loads the composing models that
are in the repository but not loaded; unloading one of them makes the ensemble UNAVAILABLE
(Triton's "depends on ... which has no loaded version."), and loading it again makes the
ensemble READY again.  :meth:`Ensembles.refresh` runs with the broker's housekeeping.
"""

from __future__ import annotations

import logging
from typing import Protocol

from tritonclient.grpc import model_config_pb2 as pb

from inferpool.broker.models import repository
from inferpool.broker.models.config_support import decoupled_cache_refusal
from inferpool.broker.models.ensemble import EnsembleScheduler, Requests
from inferpool.broker.models.ensemble_config import check_composing, wiring
from inferpool.broker.models.labels import inherit
from inferpool.broker.models.registry import ModelRecord, ModelVersion, Registry, State
from inferpool.wire.errors import InferpoolError, invalid_arg

log = logging.getLogger("inferpool.ensemble")


class Lifecycle(Protocol):
    """What ensembles ask of the models' lifecycle (``models.lifecycle``)."""

    repository: str
    pending: dict[str, ModelRecord]  # replacements loading beside their model

    def load(self, name: str) -> None: ...

    def check_loaded(self, name: str) -> None:
        """Tell those waiting for ``name``'s load how it ended, if it has."""
        ...

    def version_idle(self, mv: ModelVersion) -> None:
        """An unloading version without workers (an ensemble) ended a request."""
        ...


class _Waiting(Exception):
    """A composing model is still loading: a loading ensemble waits, a ready one is not."""


class Ensembles:
    """The ensembles served: their schedulers, and their readiness as their models come and go."""

    def __init__(self, registry: Registry, lifecycle: Lifecycle, requests: Requests) -> None:
        self.registry = registry
        self.lifecycle = lifecycle
        self.requests = requests

    def scheduler(self, mv: ModelVersion) -> EnsembleScheduler:
        """The scheduler of an ensemble version (its config was checked when read)."""
        lifecycle = self.lifecycle
        return EnsembleScheduler(
            mv, wiring(mv.config), self.requests, self.registry, lifecycle.version_idle
        )

    # ------------------------------------------------------------------ readiness
    def refresh(self) -> None:
        """Bring every ensemble version's state up to date with its composing models."""
        records = [*self.registry.records.values(), *self.lifecycle.pending.values()]
        for record in records:
            for mv in record.versions.values():
                if isinstance(mv.scheduler, EnsembleScheduler) and mv.state is not State.UNLOADING:
                    self._update(record, mv, mv.scheduler)

    def _update(self, record: ModelRecord, mv: ModelVersion, scheduler: EnsembleScheduler) -> None:
        loading = mv.state is State.LOADING
        try:
            versions = self._composing(mv, scheduler, loading)
            configs = {dep: version.config for dep, version in versions.items()}
            decoupled = check_composing(scheduler.wiring, mv.repository_config, configs)
            if decoupled and mv.repository_config.response_cache.enable:
                raise decoupled_cache_refusal(mv.name)
        except _Waiting as waiting:
            if loading:
                return
            state, reason = State.UNAVAILABLE, str(waiting)
        except InferpoolError as err:
            state, reason = State.UNAVAILABLE, err.message
        else:
            state, reason = State.READY, ""
            steps = {dep: version.labels for dep, version in versions.items()}
            mv.labels = inherit(mv.file_labels, scheduler.wiring, steps, mv.labels)
            if decoupled != mv.decoupled:
                config = pb.ModelConfig()
                config.CopyFrom(mv.repository_config)
                config.model_transaction_policy.decoupled = decoupled
                mv.use_config(config)
        if (state, reason) == (mv.state, mv.reason):
            return
        mv.set_state(state, reason)
        if state is State.READY:
            log.info("ensemble %s is READY", mv.label)
        else:
            log.error("ensemble %s is UNAVAILABLE: %s", mv.label, reason)
        if loading:
            self.lifecycle.check_loaded(record.name)

    def _composing(
        self, mv: ModelVersion, scheduler: EnsembleScheduler, loading: bool
    ) -> dict[str, ModelVersion]:
        """The version each composing model runs on, or why the ensemble cannot run."""
        name = mv.name
        cycle = self._cycle(name, scheduler, [name])
        if cycle:
            raise invalid_arg(
                f"circular dependency between ensembles: {name} -> ... -> {cycle[-1]} -> {name}"
            )
        lifecycle = self.lifecycle
        versions: dict[str, ModelVersion] = {}
        missing: list[str] = []
        waiting = ""
        for step in scheduler.wiring.steps:
            dep = step.model_name
            record = self.registry.records.get(dep)
            if record is None:
                if dep not in repository.list_models(lifecycle.repository):
                    missing.append(dep)
                elif loading and dep not in lifecycle.pending:
                    lifecycle.load(dep)  # Triton loads what an ensemble it loads needs
                    waiting = dep
                else:
                    raise _no_version(name, dep)
                continue
            version = self._version_of(name, dep, record, step.model_version)
            if version is None:
                waiting = dep
            else:
                versions[dep] = version
        if missing:
            raise invalid_arg(
                f"ensemble {name} contains models that are not available or ambiguous: "
                f"{', '.join(sorted(set(missing)))}"
            )
        if waiting:
            raise _Waiting(_no_version(name, waiting).message)
        return versions

    @staticmethod
    def _version_of(
        ensemble: str, dep: str, record: ModelRecord, wanted: int
    ) -> ModelVersion | None:
        """The version of ``dep`` a step runs on; None while it is still loading."""
        if record.error is not None and not record.versions:
            raise invalid_arg(
                f"ensemble '{ensemble}' depends on '{dep}' which is not valid. Model '{dep}' "
                f"failed with error: {record.error.message}"
            )
        ready = record.ready_versions()
        if wanted > 0:
            version = record.versions.get(wanted)
            if version is not None and version.state is State.READY:
                return version
            if version is not None and version.state is State.LOADING:
                return None
            raise invalid_arg(
                f"ensemble '{ensemble}' depends on '{dep}' whose required version {wanted} is "
                "not loaded."
            )
        if ready:
            return ready[-1]
        if any(v.state is State.LOADING for v in record.versions.values()):
            return None
        reasons = "; ".join(v.reason for v in record.versions.values() if v.reason)
        failed = f" Model '{dep}' loading failed with error: {reasons}" if reasons else ""
        raise invalid_arg(_no_version(ensemble, dep).message + failed)

    def _cycle(self, start: str, scheduler: EnsembleScheduler, path: list[str]) -> list[str]:
        """The ensembles from ``start`` back to itself through its steps, if any."""
        records = self.registry.records
        for dep in scheduler.wiring.models():
            if dep == start:
                return path
            if dep in path:
                continue
            record = records.get(dep)
            inner = next(
                (
                    v.scheduler
                    for v in (record.versions.values() if record else ())
                    if isinstance(v.scheduler, EnsembleScheduler)
                ),
                None,
            )
            if inner is not None:
                found = self._cycle(start, inner, [*path, dep])
                if found:
                    return found
        return []


def _no_version(ensemble: str, dep: str) -> InferpoolError:
    return invalid_arg(f"ensemble '{ensemble}' depends on '{dep}' which has no loaded version.")
