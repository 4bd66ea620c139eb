"""Shared fixtures: one local Ray for the whole session, started by the tests themselves."""
import numpy as np
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


@pytest.fixture(scope="session")
def sec51_problem():
    """The kernel spec's §5.1 seed-0 set-up: default_rng(0) draws theta* [d], then the X_i [n, d], then the
    noise (sigma 0.5); M=25 clients, n_i=500, d=100, eta=0.1. Returns (theta_star, X, ys, eta)."""
    rng = np.random.default_rng(0)
    M, d, n = 25, 100, 500
    theta_star = rng.normal(size=d)
    X = [rng.normal(size=(n, d)) for _ in range(M)]
    ys = [x @ theta_star + 0.5 * rng.normal(size=n) for x in X]
    return theta_star, X, ys, 0.1
