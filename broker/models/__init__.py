"""The broker's models: the repository, configurations, load/unload/reload, the schedulers
and statistics."""
