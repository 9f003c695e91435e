"""The broker<->worker contract: the spawn spec, the channel's messages, exit codes, limits.

``spec`` is what a worker gets at spawn (in its environment) and the exit codes it answers
with; ``messages`` is what the two sides say over the worker's channel; ``link`` is one end
of that channel.  docs/internals.md walks through all of it.  A worker imports these before
it is pinned, so they use the standard library and orjson only.
"""
