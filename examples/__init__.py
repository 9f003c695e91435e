"""The embedded example model repository that `inferpool serve` uses by default."""
