"""Backends: the API a backend author imports (backends.api) and the built-in backends."""
