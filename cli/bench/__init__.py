"""``inferpool bench``: a perf_analyzer for inferpool.

It sends a model requests from N concurrent senders per concurrency level, measures each
request's latency at the client, takes the server's own breakdown (queue, compute input,
infer, output) from the statistics API for the same window, and reports both: a table, JSON,
CSV and a plot.  The modules, in the order a run uses them: ``command`` (the subcommand),
``tensors`` (the inputs), ``transports`` (how requests travel), ``runner`` (the levels),
``results`` (what was measured), ``display`` (progress and tables), ``plot`` (the picture).
"""
