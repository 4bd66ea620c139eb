"""Shared fixtures: one local Ray for the whole session, started by the tests themselves."""
import pytest
import ray
import torch


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray (2 CPUs, no dashboard), shut down at the end of the session."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()


@pytest.fixture
def one_torch_thread():
    """One torch thread: small matrices on a shared 2-core machine slow down 30x with two."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
