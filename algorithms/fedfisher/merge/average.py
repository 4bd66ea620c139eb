"""One-shot FedAvg: the data-size-weighted average of the local models (the FedFisher paper)."""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def client_weights(sizes: ArrayLike) -> np.ndarray:
    """p_i = n_i / sum_k n_k (the paper code's weighting; eq. (1) has equal n)."""
    sizes = np.asarray(sizes, dtype=np.float64)
    if sizes.sum() <= 0:
        raise ValueError("client sizes must sum to a positive number")
    return sizes / sizes.sum()


def weighted_average(models: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_i p_i W_i for models stacked as [M, d] and weights summing to 1."""
    return np.tensordot(np.asarray(weights, dtype=np.float64), np.asarray(models, dtype=np.float64), axes=1)
