"""The broker process, split by its three jobs: ``front`` (sockets, admission, responses,
shared-memory registrations, leases), ``models`` (repository, configuration, lifecycle,
schedulers, statistics) and ``pool`` (worker processes, their channels, placement and
output regions).  ``server`` wires them into one event loop."""
