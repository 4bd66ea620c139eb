"""Delayed-Poisson compute times (the FedLRGD paper): each call takes shift + Exp(rate)."""
from __future__ import annotations

import numpy as np

from raysim.core.rng import SERVER, SETUP, stream
from raysim.system.quantile_table import LOWER_LIMIT, TABLE_SHAPES, tabled_quantile


def gamma_quantile(shape: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The Gamma(shape, 1) quantile: x with P(shape, x) = u, elementwise; 0 where shape or u is 0.

    It turns one uniform per client into that client's Erlang time, so a round's clients are sampled from one
    vector of uniforms. Each element's value depends on its own (shape, u) alone, never on its neighbours or the
    batch, which keeps a client's time independent of how clients are packed into actors: integer shapes up to
    TABLE_SHAPES (those local training gives) are interpolated from a table per shape (`tabled_quantile`), the rest
    solved by scipy's `gammaincinv`, a scalar ufunc.
    """
    from scipy.special import gammaincinv  # 0.16 s to import: not on `import raysim`'s path

    a = np.asarray(shape, dtype=np.float64)
    p = np.asarray(u, dtype=np.float64)
    if not (np.all(np.isfinite(a)) and np.all(a >= 0)):
        raise ValueError(f"Gamma shapes must be finite and >= 0, got {a[~(np.isfinite(a) & (a >= 0))][:3]}")
    if not np.all((p >= 0) & (p < 1)):
        raise ValueError(f"uniforms must lie in [0, 1), got {p[~((p >= 0) & (p < 1))][:3]}")
    a, p = np.broadcast_arrays(a, p)
    shape_out = a.shape
    a, p = a.ravel(), p.ravel()
    x = np.zeros(a.size)
    tabled = (a >= 1) & (a <= TABLE_SHAPES) & (a == np.floor(a)) & (p >= LOWER_LIMIT)
    x[tabled] = tabled_quantile(a[tabled], p[tabled])
    rest = (a > 0) & (p > 0) & ~tabled
    x[rest] = gammaincinv(a[rest], p[rest])
    return x.reshape(shape_out)


def compute_time(
    calls: float | np.ndarray,
    rng: np.random.Generator | np.ndarray,
    shift: float,
    rate: float,
    speed: float | np.ndarray = 1.0,
    fixed: bool = False,
) -> float | np.ndarray:
    """Time of `calls` oracle calls: (calls*shift + Gamma(calls, 1/rate)) / speed (the FedLRGD paper's (20));
    with `fixed`, its mean calls*(shift + 1/rate) / speed.

    The Gamma draw is the quantile of a uniform: `rng` is a Generator (fresh uniforms) or the
    uniforms themselves. Exactly 0.0 for zero calls; an array of call counts gives an array of
    independent times.
    """
    c = np.asarray(calls, dtype=float)
    if np.any(c < 0):
        raise ValueError(f"oracle calls must be >= 0, got {calls}")
    u = rng.random(c.shape) if isinstance(rng, np.random.Generator) else np.asarray(rng, dtype=float)
    t = (c * shift + (c if fixed else gamma_quantile(c, u)) / rate) / speed
    return float(t) if t.ndim == 0 else t


def speed_factors(num_clients: int, sigma: float, seed: int) -> np.ndarray:
    """Per-client lognormal(0, sigma) speed factors: the first num_clients draws of the stream
    (seed, SETUP, SERVER, "speed"), so a client's factor does not depend on the federation size."""
    return stream(seed, SETUP, SERVER, "speed").lognormal(0.0, sigma, num_clients)
