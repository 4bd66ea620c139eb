"""The Gamma(k, 1) quantile for integer shapes k up to TABLE_SHAPES, interpolated from a table per shape.

A round's compute times are one Gamma quantile per client (the FedLRGD paper's delayed-Poisson model, Sec. II-D1).
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

TABLE_SHAPES = 256  # shapes 1..256 are interpolated: 6.5 MB of coefficients when every interval of every shape is used
LOWER_LIMIT = 2.0**-10  # u below it is scipy's (one client in a thousand): the table starts there
STEP = 0.02  # between nodes in w: the interpolant's own error is then below the nodes'
_W0 = math.log(-math.log1p(-LOWER_LIMIT))
_INTERVALS = math.ceil((math.log(53 * math.log(2)) - _W0) / STEP)  # past u = 1 - 2^-53, the largest double below 1


class _Tables:
    """Every interpolated shape's coefficients in one array, shape k's interval j at row (k - 1) * _INTERVALS + j, so
    a round's clients of every shape are evaluated together. An interval is built when a client first needs it: a
    run builds only its clients' shapes and intervals (a round of a thousand clients of one shape, most of its 527),
    so a shape held by a few clients costs a few intervals, not a table."""

    def __init__(self) -> None:
        self.coefficients = np.zeros((TABLE_SHAPES * _INTERVALS, 6))
        self.built = np.zeros(TABLE_SHAPES * _INTERVALS, dtype=bool)
        self.lock = threading.Lock()  # a shard's threads may need the same intervals at once: they are built once

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The coefficients of `rows`, [len(rows), 6], the missing ones built first."""
        if not self.built[rows].all():
            with self.lock:
                missing = np.unique(rows[~self.built[rows]])
                if missing.size:
                    self.coefficients[missing] = _hermite_coefficients(missing // _INTERVALS + 1, missing % _INTERVALS)
                    self.built[missing] = True
        return np.take(self.coefficients, rows, axis=0)


_TABLES = _Tables()


def _hermite_coefficients(k: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Shape k's interval j, elementwise: the quintic c0 + c1 t + ... + c5 t^5 in t = (w - w_j)/STEP that matches the
    quantile and its first two derivatives at both ends, nodes j and j + 1 (a node two intervals share evaluated once)."""
    per_shape = _INTERVALS + 1
    nodes, at = np.unique(np.concatenate([k, k]) * per_shape + np.concatenate([j, j + 1]), return_inverse=True)
    (f0, f1), (g0, g1), (h0, h1) = (v[at].reshape(2, -1) for v in _node(nodes // per_shape, nodes % per_shape))
    rise = f1 - f0
    return np.stack([f0, g0, 0.5 * h0,
                     10.0 * rise - 6.0 * g0 - 4.0 * g1 - 1.5 * h0 + 0.5 * h1,
                     -15.0 * rise + 8.0 * g0 + 7.0 * g1 + 1.5 * h0 - h1,
                     6.0 * rise - 3.0 * g0 - 3.0 * g1 - 0.5 * h0 + 0.5 * h1], axis=1)


def _node(k: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Shape k's quantile at node j (w = _W0 + j STEP) and its first two derivatives in t, elementwise: scipy's
    quantile, then x' = v S(x) and x'' = x' (1 + v S'(x)) with libm's exp and log (one element at a time)."""
    from scipy.special import gammainccinv, gammaincinv  # 0.16 s to import: not on `import raysim`'s path

    v = np.array([math.exp(w) for w in (_W0 + j * STEP).tolist()])
    x = np.empty(v.size)
    low = v < math.log(2)  # u < 1/2: the lower tail's inverse; above, the upper one's keeps the digits of 1 - u
    x[low] = gammaincinv(k[low], [-math.expm1(-vi) for vi in v[low].tolist()])
    x[~low] = gammainccinv(k[~low], [math.exp(-vi) for vi in v[~low].tolist()])
    m = k - 1.0
    s = np.array([math.exp(-vi - (mi * math.log(xi) - xi - math.lgamma(mi + 1.0)))
                  for vi, xi, mi in zip(v.tolist(), x.tolist(), m.tolist())])
    d1 = v * s * STEP
    return x, d1, d1 * (1.0 + v * (-1.0 - s * (m / x - 1.0))) * STEP


def tabled_quantile(k: np.ndarray, u: np.ndarray) -> np.ndarray:
    """x with P(k, x) = u, elementwise, for integer shapes 1 <= k <= TABLE_SHAPES and u in [LOWER_LIMIT, 1): the
    exponential's -log(1 - u) exactly for k = 1, the table's interpolant for the rest."""
    from scipy.special import xlog1py, xlogy  # scalar C: scipy's log1p, libm's log

    shapes = np.asarray(k, dtype=np.int64)
    v = xlog1py(-1.0, -np.asarray(u, dtype=np.float64))  # -log(1 - u)
    s = xlogy(1.0, v)
    s -= _W0
    s *= 1.0 / STEP
    i = s.astype(np.int64)  # s >= 0 up to rounding, which truncation takes to interval 0
    t = s - i
    i += (shapes - 1) * _INTERVALS
    c = _TABLES.rows(i)
    x = c[:, 5] * t
    for j in (4, 3, 2, 1):
        x += c[:, j]
        x *= t
    x += c[:, 0]
    np.copyto(x, v, where=shapes == 1)
    return x
