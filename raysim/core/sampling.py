"""The server's default client sampler."""
from __future__ import annotations

import numpy as np


def sample_clients(num_clients: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """k distinct clients uniformly at random without replacement (FedPAQ's partial participation), sorted."""
    if k >= num_clients:
        return np.arange(num_clients)
    return np.sort(rng.choice(num_clients, size=k, replace=False))
