"""P = softmax(LOGITS)."""

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            e = np.exp(logits - logits.max())
            p = (e / e.sum()).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("P", p)]))
        return responses
