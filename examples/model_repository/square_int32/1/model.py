"""Triton's python_backend example ``square_int32`` (examples/decoupled): a decoupled model.

For a request with IN = [n] it sends n responses, each with OUT = [n], from a thread of its
own, then closes the request with a final flag.  ``inferpool infer square_int32 --input
IN=3`` prints the three; ``Client.stream`` / ``AsyncClient.stream`` yield them.
"""

import json
import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Every python model defines a class of this name."""

    def initialize(self, args):
        """Checks that the configuration is decoupled: this model answers a request with any
        number of responses."""
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                f"the model `{args['model_name']}` can generate any number of responses per "
                "request, enable decoupled transaction policy in model configuration to "
                "serve this model"
            )
        self.inflight = []

    def execute(self, requests):
        """Starts a thread per request and returns at once: decoupled responses go through
        each request's response sender, not the return value."""
        self.inflight = [thread for thread in self.inflight if thread.is_alive()]
        for request in requests:
            thread = threading.Thread(
                target=self.respond,
                args=(
                    request.get_response_sender(),
                    pb_utils.get_input_tensor_by_name(request, "IN").as_numpy(),
                ),
                daemon=True,
            )
            self.inflight.append(thread)
            thread.start()
        return None

    def respond(self, response_sender, in_input):
        for _ in range(in_input[0]):
            out_output = pb_utils.Tensor("OUT", np.array([in_input[0]], np.int32))
            response_sender.send(pb_utils.InferenceResponse(output_tensors=[out_output]))
        response_sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        """Waits until every response thread has sent its final response."""
        for thread in self.inflight:
            thread.join()
