"""Closed forms and exact numerics of the latency model (the FedLRGD paper)."""
from __future__ import annotations

import math

import numpy as np
from scipy import integrate, special, stats


def erlang_cdf(y: float | np.ndarray, b: int, rate: float = 1.0) -> float | np.ndarray:
    """CDF of Erlang(b, rate) (73): 1 - e^{-ry} sum_{k<b} (ry)^k / k!."""
    return stats.gamma.cdf(y, b, scale=1.0 / rate)


def erlang_quantile(b: int, q: float) -> float:
    """The quantile F_Y^{-1}(1 - 1/q) of Erlang(b, 1) (74)."""
    return float(stats.gamma.isf(1.0 / q, b))


def _max_survival(y: float, b: int, k: int) -> float:
    """P(max of k Erlang(b,1) > y) = 1 - F(y)^k, accurate both where F is small and near 1."""
    lower, upper = special.gammainc(b, y), special.gammaincc(b, y)
    if lower == 0.0:
        return 1.0
    log_f = math.log(lower) if lower < 0.5 else math.log1p(-upper)
    return -math.expm1(k * log_f)


def expected_max_erlang(b: int, k: int, rate: float = 1.0) -> float:
    """E[max of k i.i.d. Erlang(b, rate)] = integral_0^inf 1 - F(y)^k dy (the FedLRGD paper's (19)), by quadrature.

    The range is split at quantiles of the maximum itself, F^{-1}(u^{1/k}), so that the drop of
    the integrand from 1 to 0 is resolved for any b and k.
    """
    if b == 0 or k == 0:
        return 0.0
    levels = (1e-9, 1e-3, 0.1, 0.5, 0.9, 1 - 1e-3, 1 - 1e-9)
    cuts = [0.0] + [float(stats.gamma.isf(-math.expm1(math.log(u) / k), b)) for u in levels]
    pieces = [
        integrate.quad(_max_survival, lo, hi, args=(b, k), limit=200, epsabs=1e-11)[0]
        for lo, hi in zip(cuts[:-1], cuts[1:])
    ]
    tail = integrate.quad(_max_survival, cuts[-1], np.inf, args=(b, k), limit=200, epsabs=1e-11)
    return (math.fsum(pieces) + tail[0]) / rate


def expected_compute_phase(b: int, k: int, shift: float = 1.0, rate: float = 1.0) -> float:
    """Exact mean compute phase of k clients making b calls each: b*shift + E max Erlang(b, rate) (19)."""
    return b * shift + expected_max_erlang(b, k, rate)


def prop2_bounds(b: int, q: float) -> tuple[float, float]:
    """Proposition 2 (App. B): (1/2 log(q-1) + 1/2 log b, 2 log(q-1) + 2b log 2b), for (q-1)b >= 55."""
    if (q - 1) * b < 55:
        raise ValueError(f"Proposition 2 needs (q-1)*b >= 55, got q={q}, b={b}")
    lower = 0.5 * math.log(q - 1) + 0.5 * math.log(b)
    upper = 2.0 * math.log(q - 1) + 2.0 * b * math.log(2 * b)
    return lower, upper


def explicit_queue_bound(k: int, nu: float) -> float:
    """Upper bound k + 1/(nu-1) on the mean time for k uploads to drain an empty M/M/1 queue (cf. FedLRGD Sec. II-D2)."""
    if nu <= 1:
        raise ValueError(f"the M/M/1 queue is unstable unless nu > 1, got nu={nu}")
    return k + 1.0 / (nu - 1.0)


def expected_explicit_drain(k: int, nu: float) -> float:
    """Exact E[last departure] of k Poisson(1) arrivals into an empty FIFO M/M/1 (service nu).

    E[D_k] = k + E[L_k]/nu + 1/nu, with L_n the number in system seen by arrival n, whose law is
    propagated through its embedded Markov chain (geometric departures between arrivals).
    """
    if k == 0:
        return 0.0
    p = nu / (1.0 + nu)
    seen, nxt = np.arange(k)[:, None], np.arange(k)[None, :]
    served = seen + 1 - nxt
    trans = np.where((nxt >= 1) & (served >= 0), p ** np.maximum(served, 0) / (1.0 + nu), 0.0)
    trans[:, 0] = p ** (seen[:, 0] + 1)
    law = np.zeros(k)
    law[0] = 1.0
    for _ in range(k - 1):
        law = law @ trans
    return k + float(law @ np.arange(k)) / nu + 1.0 / nu


def paper_phase_estimate(b: int, k: int) -> float:
    """The paper's closed form (19) for the expected compute phase: log(k) + 2b."""
    return math.log(k) + 2.0 * b


def von_mises_a(x: float, b: int) -> float:
    """The von Mises auxiliary function (16): a(x) = sum_{j<b} (b-1)!/(b-j-1)! x^{-j}."""
    term, total = 1.0, 1.0
    for j in range(1, b):
        term *= (b - j) / x
        total += term
    return total


def gumbel_phase_estimate(b: int, k: int) -> float:
    """Gumbel form (16)-(17) of the expected compute phase with the exact Q: gamma_E a(Q) + Q + b."""
    q = erlang_quantile(b, k)
    return float(np.euler_gamma) * von_mises_a(q, b) + q + b
