"""Shared fixtures: one local Ray for the whole session, started by the tests themselves."""
import pytest
import ray


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray (2 CPUs, no dashboard), shut down at the end of the session."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
