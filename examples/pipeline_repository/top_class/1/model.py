"""The most likely class of RAW: the "probabilities" ensemble called with BLS, then argmax.

RAW is passed on as it lies in shared memory (no copy); the ensemble's PROBS are read where
softmax wrote them.  An input with a single value needs no model at all: business logic.
"""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The most likely class of RAW, through the probabilities ensemble."""

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = request.inputs()[0]  # RAW, the only input
            if raw.shape()[0] == 1:
                probs = np.ones(1, np.float32)
            else:
                reply = pb_utils.InferenceRequest(
                    model_name="probabilities",
                    inputs=[raw],
                    requested_output_names=["PROBS"],
                ).exec()
                if reply.has_error():
                    responses.append(pb_utils.InferenceResponse(error=reply.error()))
                    continue
                probs = reply.output_tensors()[0].as_numpy()  # PROBS, the one asked for
            best = int(np.argmax(probs))
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("CLASS", np.array([best], np.int64)),
                        pb_utils.Tensor("PROB", probs[best : best + 1].astype(np.float32)),
                    ]
                )
            )
        return responses
