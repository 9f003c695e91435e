"""The built-in ``onnxruntime`` backend (also platform ``onnxruntime_onnx``).

Serves ``<version>/model.onnx`` with Triton's onnxruntime-backend semantics; needs the
``onnx`` extra (``pip install 'inferpool[onnx]'``).  See ``backend.py`` for the map of the
package.
"""

from inferpool.backends.onnxruntime.backend import OnnxBackend

BACKEND = OnnxBackend

__all__ = ["BACKEND"]
