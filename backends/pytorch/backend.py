"""The PyTorch backend: Triton's libtorch backend (``model.pt``) over inferpool's worker API.

``PyTorchModel`` reads the config (parameters, outputs, sequence controls and states);
``PyTorchInstance`` loads the model onto its device, validates the config against the
model's forward signature, and runs batches: per-request checks, one forward pass for the
whole batch, outputs split back and written into shared memory, and the seed's statistics.
Ragged inputs, batch inputs and batch outputs are Triton's (``backends.batch_io``); a model
that has any runs every batch through the general path (no per-signature plan).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Sequence
from typing import Any

import torch

from inferpool.backends import sequence
from inferpool.backends.api import (
    Backend,
    Model,
    ModelInstance,
    Request,
    Response,
    Timestamps,
    now_ns,
)
from inferpool.backends.batch_io import BatchIO
from inferpool.backends.pytorch import artifact, naming
from inferpool.backends.pytorch.device import Placement
from inferpool.backends.pytorch.inputs import InputAssembler, Prepared
from inferpool.backends.pytorch.outputs import OutputWriter, normalize
from inferpool.backends.pytorch.parameters import Settings
from inferpool.backends.pytorch.shape_checks import Plan, Plans
from inferpool.backends.pytorch.weights import SharedWeights, held_bytes, region_key
from inferpool.wire.errors import InferpoolError, internal

_stamps = tuple.__new__  # a NamedTuple without its Python-level __new__


class PyTorchModel(Model):
    """A PyTorch model: its config checked, its tensors named by convention."""

    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_ModelInitialize: %s (version %d)", self.name, self.version)
        cfg = self.config
        self.batch_io = BatchIO(cfg)
        self.settings = Settings.parse(self)
        self.settings.log_to(self.log, self.name)
        self.settings.apply_threads(self.log, self.name)
        self.controls = sequence.controls(cfg, self.name)
        self.states = sequence.states(cfg, self.name, self.repository_path)
        self.inputs = [naming.tensor_spec(i) for i in cfg.input]
        self.outputs = [naming.tensor_spec(o) for o in cfg.output]


class PyTorchInstance(ModelInstance):
    """One loaded copy of the model on its device, executing batches."""

    model: PyTorchModel

    def initialize(self) -> None:
        model = self.model
        self.log.info(
            "TRITONBACKEND_ModelInstanceInitialize: %s (%s device %d)",
            self.name,
            self.kind,
            self.device_id,
        )
        with contextlib.ExitStack() as stack:  # a failed load releases what it had taken
            self.placement = Placement(self.kind, self.device_id, self.cuda_ordinal, self.name)
            stack.callback(self.placement.close)
            path = artifact.find(
                model.artifact_path, model.config.default_model_filename, self.name
            )
            self.artifact = artifact.load(path, self.placement.device, model.name)
            self.forward = self.artifact.forward
            stack.callback(self._drop_model)
            self.weights = self._share_weights(path)
            self._report_memory()
            batching = model.max_batch_size > 0
            layout = naming.input_layout(
                self.artifact.args,
                model.inputs,
                model.controls,
                model.states,
                model.name,
                batching,
                self.log,
                model.batch_io.targets,
            )
            self.assembler = InputAssembler(
                model.name,
                model.inputs,
                model.controls,
                model.states,
                layout,
                model.max_batch_size,
                self.placement.input_device,
                model.batch_io,
            )
            self.writer = OutputWriter(
                model.name,
                naming.output_layout(model.outputs, model.states, model.name, batching, self.log),
                batching,
                model.batch_io,
            )
            batch_io = model.batch_io
            # a plan serves a lone request of a known signature: none where the batch builds
            # inputs or splits outputs of its own
            self.planning = not (batch_io.ragged or batch_io.inputs or batch_io.outputs)
            self.plans = Plans(self.assembler, self.writer)
            self._resources = stack.pop_all()

    def _share_weights(self, path: str) -> SharedWeights | None:
        model = self.model
        if not model.settings.weight_sharing:
            return None
        module = self.artifact.module
        if self.kind != "CPU" or module is None:
            self.log.warning(
                "ENABLE_WEIGHT_SHARING: weights of %s instances (%s artifact) are not shared "
                "between processes; '%s' keeps its own copy",
                self.kind,
                self.artifact.format,
                self.name,
            )
            return None
        regions = model.shared_regions
        if regions is None:
            self.log.warning(
                "ENABLE_WEIGHT_SHARING: no broker serves '%s' (a BackendHarness without "
                "regions): it keeps its own copy of the weights",
                self.name,
            )
            return None
        key = f"weights-{region_key(path, 'cpu')}"
        with torch.no_grad():  # not inference tensors: see artifact.load
            return SharedWeights.share(module, regions, key, self.log)

    def _report_memory(self) -> None:
        """The weights this instance holds: host memory shared with an instance that filled
        the region is that instance's, not this one's."""
        module = self.artifact.module
        if module is None:
            return
        attached = self.weights is not None and not self.weights.created
        for device, size in held_bytes(module).items():
            if device == "cuda":
                self.report_memory_usage("GPU", size)
            elif device == "cpu" and not attached:
                self.report_memory_usage("CPU", size)

    def _drop_model(self) -> None:
        del self.artifact, self.forward
        gc.collect()  # TorchScript modules hold cycles: free the weights (and their mapping) now

    def finalize(self) -> None:
        self.log.info("TRITONBACKEND_ModelInstanceFinalize: %s", self.name)
        self._resources.close()

    # ------------------------------------------------------------------ execution
    def execute(self, requests: list[Request]) -> None:
        """Answer each request as soon as its outputs are written, then report the
        statistics (as identity.cc sends its responses before it reports): on a lane the
        answer is on its way to the client while they are counted."""
        exec_start = now_ns()
        if len(requests) == 1 and self.planning and not self.placement.streams:  # the CPU
            plan = self.plans.get(requests[0])
            if plan is not None:  # a known signature: its checks passed when the plan was made
                self._planned(requests[0], plan, exec_start)
                return
        responses: dict[int, Response] = {}
        batch, total = self._checked(requests, responses)
        compute_start = compute_end = exec_start
        if batch:
            compute_start, compute_end = self._run(batch, responses, exec_start)
        ordered = [responses[id(request)] for request in requests]
        try:
            for request, response in zip(requests, ordered):  # noqa: B905 (one each)
                request.respond(response)
        finally:
            self._report(requests, ordered, exec_start, compute_start, compute_end, total, batch)

    def _planned(self, request: Request, plan: Plan, exec_start: int) -> None:
        """A lone request of a known signature on the CPU: its inputs taken and its outputs
        written as the plan says, around the forward pass every batch gets; answered.  The
        model's settings are put back after the answer (answering runs no torch op): their
        guard's exit is not on the way to the client."""
        response = Response(request)
        infer_start = output_start = 0  # not reached
        with self.model.settings.applied():  # on the CPU (placement.around: as it is)
            try:
                args = plan.forward_args(request.inputs)
                infer_start = now_ns()
                outputs = self._forward(args)
                output_start = now_ns()
                self.writer.write_alone(outputs, plan.rows, response, plan.writes)
            except Exception as exc:  # nothing written for it may leak
                response.discard()
                response = Response(request, InferpoolError.wrap(exc))
            if not output_start:  # the marks not reached read as the end
                output_start = now_ns()
                infer_start = infer_start or output_start
            try:
                request.respond(response)
            finally:
                rows = plan.rows
                self._report((request,), (response,), exec_start, infer_start, output_start, rows)

    def _report(
        self,
        requests: Sequence[Request],
        responses: Sequence[Response],
        exec_start: int,
        compute_start: int,
        compute_end: int,
        rows: int,
        ran: object = True,
    ) -> None:
        """Statistics of an execution that ends now: each request's, and the batch's where
        one ``ran`` (``rows`` rows)."""
        # one Timestamps for the batch and its requests (report_statistics' and
        # report_batch_statistics' reports, without building it per call)
        stamps = _stamps(Timestamps, (exec_start, compute_start, compute_end, now_ns()))
        model = self.model
        stats = model.stats
        if ran and len(requests) == 1:  # the common case: one call for both reports
            stats.report_alone(requests[0], responses[0].error is None, rows, stamps)
        else:
            for request, response in zip(requests, responses):  # noqa: B905 (one each)
                stats.report_request(request, response.error is None, stamps)
            if ran:
                stats.report_batch(rows, stamps)
        if model.settings.cache_cleaning:
            self.placement.clear_cache()

    def _forward(self, args: list[Any]) -> list[Any]:
        """The model's outputs for ``args`` (backends.pytorch.outputs.normalize)."""
        try:
            result = self.forward(*args)
        except Exception as exc:
            raise internal(f"PyTorch execute failure: {exc}") from exc
        return [result] if type(result) is torch.Tensor else normalize(result)

    def _checked(
        self, requests: list[Request], responses: dict[int, Response]
    ) -> tuple[list[Prepared], int]:
        """Every request checked on its own: those that run together and their rows; the
        others are answered in ``responses``.  A lone request that passes leaves the plan of
        its signature (backends.pytorch.shape_checks) for the next of the same."""
        batch: list[Prepared] = []
        prepare = self.assembler.prepare
        for request in requests:
            try:
                batch.append(prepare(request))
            except InferpoolError as err:
                responses[id(request)] = Response(request, err)
        if len(batch) > 1:
            return self._batchable(batch, responses)
        if not batch:
            return batch, 0
        if self.planning and not self.placement.streams:
            self.plans.add(batch[0])
        return batch, batch[0].batch  # one request: its checks kept it within max_batch_size

    def _batchable(
        self, batch: list[Prepared], responses: dict[int, Response]
    ) -> tuple[list[Prepared], int]:
        """The requests of ``batch`` that run together (those shaped as the first, unless
        they hold more rows than max_batch_size: then none), and their rows; the others are
        answered in ``responses``."""
        batch, rejected = self.assembler.split_uniform(batch)
        for p, problem in rejected:
            responses[id(p.request)] = Response(p.request, problem)
        total = sum([p.batch for p in batch])
        limit = self.assembler.max_batch_size  # the config's, read once at load
        if total != 1 and total > limit:
            error = internal(f"batch size {total} for '{self.name}', max allowed is {limit}")
            for p in batch:
                responses[id(p.request)] = Response(p.request, error)
            return [], 0
        return batch, total

    def _run(
        self, batch: list[Prepared], responses: dict[int, Response], exec_start: int
    ) -> tuple[int, int]:
        """One forward pass over ``batch``, its inputs gathered and its outputs written under
        the model's settings (inference mode); fills ``responses``; returns (compute start,
        end)."""
        placement = self.placement
        events = placement.events  # CUDA's, where the instance runs on a GPU
        pairs = [(p, Response(p.request)) for p in batch]
        infer_start = output_start = 0  # not reached
        try:
            with placement.around(self.model.settings.applied()):
                if events:
                    placement.record(0)
                args = self.assembler.forward_args(batch)
                if events:
                    placement.record(1)
                infer_start = now_ns()
                outputs = self._forward(args)
                if events:
                    placement.record(2)
                output_start = now_ns()
                self.writer.write(outputs, pairs)
            for p, response in pairs:
                responses[id(p.request)] = response
        except Exception as exc:  # the batch fails; nothing written for it may leak
            err = InferpoolError.wrap(exc)
            for p, response in pairs:
                response.discard()
                responses[id(p.request)] = Response(p.request, err)
        if not output_start:  # the marks not reached read as the end
            output_start = now_ns()
            infer_start = infer_start or output_start
        elif events:
            return placement.event_span(exec_start, infer_start, output_start)
        return infer_start, output_start


class PyTorchBackend(Backend):
    """The pytorch backend (Triton's libtorch backend, in Python)."""

    model_class = PyTorchModel
    instance_class = PyTorchInstance

    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_Initialize: %s (torch %s)", self.name, torch.__version__)
