"""The Gamma(k, 1) quantile for integer shapes k up to TABLE_SHAPES, interpolated from a table per shape.

A round's compute times are one Gamma quantile per client (the FedLRGD paper's delayed-Poisson model, §2.1).
scipy's `gammaincinv` solves each element alone, about a microsecond at the shapes local training gives (5 steps
of batch 5 are 25 calls): more than the rest of a client's bookkeeping. A solver made of many small array
operations does no better inside a shard, whose threads share the GIL. Here the quantile as a function of
w = log(-log(1 - u)), smooth over the whole range of u, is a quintic Hermite interpolant between nodes STEP apart:
their values are scipy's quantiles and their first and second derivatives are exact,

    x' = v S(x),  x'' = x' (1 + v S'(x)),  v = e^w,  S = Q/p,  S' = -1 - S ((k - 1)/x - 1),

with Q(k, x) = 1 - u the upper tail and p the Gamma(k) density. It stays within 5e-15 of the exact quantile, as
scipy's own values do, at a few dozen array operations for any number of clients. Each element's value depends on
its own (k, u) alone; its logarithms are scalar C (scipy's log1p, libm's log), not NumPy's SIMD ones, whose last bit
differs between CPUs.
"""
from __future__ import annotations

import math
import threading

import numpy as np

TABLE_SHAPES = 256  # shapes 1..256 are interpolated; a shape's table (25 KB) is built when a client first needs it
LOWER_LIMIT = 2.0**-10  # u below it is scipy's (one client in a thousand): the table starts there
STEP = 0.02  # between nodes in w: the interpolant's own error is then below the nodes'
_W0 = math.log(-math.log1p(-LOWER_LIMIT))
_INTERVALS = math.ceil((math.log(53 * math.log(2)) - _W0) / STEP)  # past u = 1 - 2^-53, the largest double below 1


class _Tables:
    """Every interpolated shape's coefficients, built on first use: one array, so a round's clients of every shape
    are evaluated together; the pages of shapes never used are never touched."""

    def __init__(self) -> None:
        self.coefficients = np.zeros((TABLE_SHAPES * _INTERVALS, 6))
        self.built = np.zeros(TABLE_SHAPES + 1, dtype=bool)
        self.lock = threading.Lock()  # a shard's threads may ask for the same shape at once

    def ensure(self, shapes: np.ndarray) -> None:
        """Build the tables of `shapes` (integers 1..TABLE_SHAPES) not built yet."""
        if self.built[shapes].all():
            return
        with self.lock:
            for k in np.unique(shapes[~self.built[shapes]]).tolist():
                if not self.built[k]:
                    self.coefficients[(k - 1) * _INTERVALS:k * _INTERVALS] = _hermite_coefficients(k)
                    self.built[k] = True


_TABLES = _Tables()


def _hermite_coefficients(k: int) -> np.ndarray:
    """Shape k's interpolant: each interval's quintic c0 + c1 t + ... + c5 t^5 in t = (w - w_j)/STEP, matching the
    quantile and its first two derivatives at both ends."""
    from scipy.special import gammainccinv, gammaincinv  # 0.16 s to import: not on `import raysim`'s path

    w = [_W0 + j * STEP for j in range(_INTERVALS + 1)]
    v = np.array([math.exp(wj) for wj in w])
    low = v < math.log(2)  # u < 1/2: the lower tail's inverse; above, the upper one's keeps the digits of 1 - u
    x = np.where(low, gammaincinv(k, [-math.expm1(-vj) for vj in v]), gammainccinv(k, [math.exp(-vj) for vj in v]))
    s = np.array([math.exp(-vj - ((k - 1) * math.log(xj) - xj - math.lgamma(k))) for vj, xj in zip(v, x)])
    d1 = v * s * STEP
    d2 = d1 * (1.0 + v * (-1.0 - s * ((k - 1) / x - 1.0))) * STEP
    f0, f1, g0, g1, h0, h1 = x[:-1], x[1:], d1[:-1], d1[1:], d2[:-1], d2[1:]
    rise = f1 - f0
    return np.stack([f0, g0, 0.5 * h0,
                     10.0 * rise - 6.0 * g0 - 4.0 * g1 - 1.5 * h0 + 0.5 * h1,
                     -15.0 * rise + 8.0 * g0 + 7.0 * g1 + 1.5 * h0 - h1,
                     6.0 * rise - 3.0 * g0 - 3.0 * g1 - 0.5 * h0 + 0.5 * h1], axis=1)


def tabled_quantile(k: np.ndarray, u: np.ndarray) -> np.ndarray:
    """x with P(k, x) = u, elementwise, for integer shapes 1 <= k <= TABLE_SHAPES and u in [LOWER_LIMIT, 1): the
    exponential's -log(1 - u) exactly for k = 1, the table's interpolant for the rest."""
    from scipy.special import xlog1py, xlogy  # scalar C: scipy's log1p, libm's log

    shapes = np.asarray(k, dtype=np.int64)
    _TABLES.ensure(shapes)
    v = xlog1py(-1.0, -np.asarray(u, dtype=np.float64))  # -log(1 - u)
    s = xlogy(1.0, v)
    s -= _W0
    s *= 1.0 / STEP
    i = s.astype(np.int64)  # s >= 0 up to rounding, which truncation takes to interval 0
    t = s - i
    i += (shapes - 1) * _INTERVALS
    c = np.take(_TABLES.coefficients, i, axis=0)
    x = c[:, 5] * t
    for j in (4, 3, 2, 1):
        x += c[:, j]
        x *= t
    x += c[:, 0]
    np.copyto(x, v, where=shapes == 1)
    return x
