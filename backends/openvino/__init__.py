"""The built-in ``openvino`` backend: ``model.xml``/``model.bin`` (or ``model.onnx``) with
Triton's openvino-backend semantics; needs the ``openvino`` extra
(``pip install 'inferpool[openvino]'``).  See ``backend.py``."""

from inferpool.backends.openvino.backend import OpenVinoBackend

BACKEND = OpenVinoBackend

__all__ = ["BACKEND"]
