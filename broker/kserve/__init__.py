"""The KServe v2 frontends: Triton's HTTP/REST and gRPC protocols, and health over HTTP.

They run in their own process (``main``, started and watched by the broker: ``process``) and
speak to the broker only in the zmq protocol, over an ipc connection (``channel``), so
Triton's clients take the zmq clients' path.
"""
