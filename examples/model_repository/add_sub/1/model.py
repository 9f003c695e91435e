"""Triton's python_backend example ``add_sub``: a python model, served by inferpool unchanged.

``inferpool infer add_sub --input INPUT0=1,2,3,4 --input INPUT1=4,3,2,1`` prints
OUTPUT0 (the sum) and OUTPUT1 (the difference).
"""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Every python model defines a class of this name."""

    def initialize(self, args):
        """Called once per instance when the model loads; ``args`` is a dict of strings,
        ``args["model_config"]`` the model configuration as JSON."""
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        """One batch of requests; return one InferenceResponse per request, in order."""
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            )
        return responses

    def finalize(self):
        """Called once per instance when the model unloads or the server stops."""
        print("Cleaning up...")
