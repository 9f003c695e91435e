"""The embedded example model repository (examples/model_repository) that `inferpool serve` uses by default."""
