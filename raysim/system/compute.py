"""Delayed-Poisson compute times (specs/fedlrgd.md §2.1): each call takes shift + Exp(rate)."""
from __future__ import annotations

import numpy as np

from raysim.rng import SETUP, stream


def compute_time(
    calls: float | np.ndarray,
    rng: np.random.Generator,
    shift: float,
    rate: float,
    speed: float | np.ndarray = 1.0,
) -> float | np.ndarray:
    """Time of `calls` oracle calls: (calls*shift + Gamma(calls, 1/rate)) / speed (§2.1, (20)).

    Exactly 0.0 for zero calls; an array of call counts gives an array of independent times.
    """
    c = np.asarray(calls, dtype=float)
    if np.any(c < 0):
        raise ValueError(f"oracle calls must be >= 0, got {calls}")
    t = (c * shift + rng.gamma(c, 1.0 / rate)) / speed
    return float(t) if t.ndim == 0 else t


def speed_factors(num_clients: int, sigma: float, seed: int) -> np.ndarray:
    """Per-client lognormal(0, sigma) speed factors, client c's from stream (seed, SETUP, c, "speed")."""
    return np.array(
        [stream(seed, SETUP, c, "speed").lognormal(0.0, sigma) for c in range(num_clients)],
        dtype=float,
    )
