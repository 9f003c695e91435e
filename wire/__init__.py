"""What two processes must agree on: error codes and the error type, the client codec
(datatypes, BYTES), zmq helpers, and the broker<->worker protocol.

Nothing here imports another inferpool package, and this module imports nothing at all,
so a worker can import the contract before it is pinned.
"""
