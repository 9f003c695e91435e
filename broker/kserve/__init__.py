"""The KServe v2 frontends: Triton's HTTP/REST and gRPC protocols, and health over HTTP.

They run in their own thread and speak to the broker only in the zmq protocol, over an
inproc connection (``channel``), so Triton's clients take the zmq clients' path.
"""
