"""The broker process: zmq frontend, admission, scheduling, worker supervision, control."""

__version__ = "0.1.0"
