"""The worker process: one per model instance, pinned, hosting one backend's lifecycle."""
