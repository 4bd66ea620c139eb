"""FisherMerge (Matena & Raffel 2022) as the FedFisher code runs it (the FedFisher paper).

W_j = sum_i p_i F_ij W_ij / sum_i p_i F_ij where that denominator exceeds `floor`, FedAvg elsewhere.
With floor 0 this is the exact solution of the Diag FedFisher objective (7).
"""
from __future__ import annotations

import numpy as np

from raysim.algorithms.fedfisher.merge.average import weighted_average


def fisher_merge(models: np.ndarray, fishers: np.ndarray, weights: np.ndarray, floor: float = 1e-6) -> np.ndarray:
    """Coordinate-wise Fisher-weighted average of [M, d] models with [M, d] diagonal Fishers."""
    p = np.asarray(weights, dtype=np.float64)[:, None]
    f = p * np.asarray(fishers, dtype=np.float64)
    total = f.sum(0)
    merged = weighted_average(models, weights)
    keep = total > floor
    merged[keep] = (f[:, keep] * np.asarray(models, dtype=np.float64)[:, keep]).sum(0) / total[keep]
    return merged
