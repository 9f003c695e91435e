"""inferpool clients: the zmq client (sync and asyncio) and the wire codec they share."""

from client.errors import Code, InferpoolError
from client.sync import Client, InferResult, default_endpoint

__all__ = ["Client", "Code", "InferResult", "InferpoolError", "default_endpoint"]
