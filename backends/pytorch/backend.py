"""The PyTorch backend: Triton's libtorch backend (``model.pt``) over inferpool's worker API.

``PyTorchModel`` reads the config (parameters, outputs, sequence controls and states);
``PyTorchInstance`` loads the model onto its device, validates the config against the
model's forward signature, and runs batches: per-request checks, one forward pass for the
whole batch, outputs split back and written into shared memory, and the seed's statistics.
"""

from __future__ import annotations

import contextlib
import gc

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
from inferpool.backends.pytorch import artifact, naming
from inferpool.backends.pytorch.device import Placement
from inferpool.backends.pytorch.inputs import InputAssembler, Prepared
from inferpool.backends.pytorch.outputs import OutputWriter, normalize
from inferpool.backends.pytorch.parameters import Settings
from inferpool.backends.pytorch.weights import SharedWeights, held_bytes, region_key
from inferpool.wire.errors import InferpoolError, internal, unsupported

_stamps = tuple.__new__  # a NamedTuple without its Python-level __new__


class PyTorchModel(Model):
    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_ModelInitialize: %s (version %d)", self.name, self.version)
        cfg = self.config
        for field, what in (("batch_input", "batch inputs"), ("batch_output", "batch outputs")):
            if len(getattr(cfg, field)):
                raise unsupported(
                    f"model '{self.name}': {what} are not supported by the pytorch backend"
                )
        if any(i.allow_ragged_batch for i in cfg.input):
            raise unsupported(
                f"model '{self.name}': ragged inputs are not supported by the pytorch backend"
            )
        self.settings = Settings.parse(self)
        self.settings.log_to(self.log, self.name)
        self.settings.apply_threads(self.log, self.name)
        self.controls = sequence.controls(cfg, self.name)
        self.states = sequence.states(cfg, self.name, self.repository_path)
        self.inputs = [naming.tensor_spec(i) for i in cfg.input]
        self.outputs = [naming.tensor_spec(o) for o in cfg.output]


class PyTorchInstance(ModelInstance):
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
            self.artifact = artifact.load(
                path, self.placement.device, model.settings.inference_mode, model.name
            )
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
            )
            self.assembler = InputAssembler(
                model.name,
                model.inputs,
                model.controls,
                model.states,
                layout,
                model.max_batch_size,
                self.placement.input_device,
            )
            self.writer = OutputWriter(
                model.name,
                naming.output_layout(model.outputs, model.states, model.name, batching, self.log),
                batching,
            )
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
        with torch.inference_mode(model.settings.inference_mode):
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
    def execute(self, requests: list[Request]) -> list[Response]:
        model = self.model
        exec_start = now_ns()
        responses: dict[int, Response] = {}
        batch: list[Prepared] = []
        prepare = self.assembler.prepare
        for request in requests:
            try:
                batch.append(prepare(request))
            except InferpoolError as err:
                responses[id(request)] = Response(request, err)
        total = 0
        if len(batch) > 1:
            batch, total = self._batchable(batch, responses)
        elif batch:  # one request: its checks kept it within max_batch_size
            total = batch[0].batch
        compute_start = compute_end = exec_start
        if batch:
            compute_start, compute_end = self._run(batch, responses, exec_start)
        # one Timestamps for the batch and its requests (report_statistics' and
        # report_batch_statistics' reports, without building it per call)
        stamps = _stamps(Timestamps, (exec_start, compute_start, compute_end, now_ns()))
        stats = model.stats
        ordered = []
        for request in requests:
            response = responses[id(request)]
            stats.report_request(request, response.error is None, stamps)
            ordered.append(response)
        if batch:
            stats.report_batch(total, stamps)
        if model.settings.cache_cleaning:
            self.placement.clear_cache()
        return ordered

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
                try:
                    result = self.forward(*args)
                except Exception as exc:
                    raise internal(f"PyTorch execute failure: {exc}") from exc
                outputs = normalize(result)
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
    model_class = PyTorchModel
    instance_class = PyTorchInstance

    def initialize(self) -> None:
        self.log.info("TRITONBACKEND_Initialize: %s (torch %s)", self.name, torch.__version__)
