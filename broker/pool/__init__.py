"""The broker's worker pool: worker processes and their channels, liveness, placement on
the machine's cores, NUMA nodes and GPUs, and the workers' output regions."""
