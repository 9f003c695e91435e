"""P = softmax(LOGITS)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """The softmax of LOGITS."""

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = request.inputs()[0].as_numpy()  # LOGITS, the only input
            e = np.exp(logits - logits.max())
            p = (e / e.sum()).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("P", p)]))
        return responses
