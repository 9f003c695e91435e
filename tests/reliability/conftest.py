import pytest


@pytest.fixture(autouse=True)
def _no_leaked_regions(shm_clean: None) -> None:
    """Every test of this kind fails if a region of its run is left in /dev/shm."""
