"""Delayed-Poisson compute times (specs/fedlrgd.md §2.1): each call takes shift + Exp(rate)."""
from __future__ import annotations

import numpy as np
import torch

from raysim.rng import SERVER, SETUP, stream


NEWTON_STEPS = 100  # cap; from its start it converges in 3-4 steps


def gamma_quantile(shape: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The Gamma(shape, 1) quantile: x with P(shape, x) = u (regularized lower incomplete gamma), 0 where shape is 0.

    Newton's method on the log of the nearer tail (P = u, or Q = 1 - u where u > 1/2) in log x,
    float64, from the larger of the Wilson-Hilferty start and a lower bound, so neither tail loses precision. It turns one uniform
    per client into that client's Erlang time, so a whole round's clients are sampled from one
    vector of uniforms (numpy has no inverse; scipy.special would cost every actor a second to import).
    """
    a = torch.as_tensor(np.asarray(shape, dtype=np.float64))
    p = torch.as_tensor(np.asarray(u, dtype=np.float64))
    a, p = torch.broadcast_tensors(a, p)
    out = torch.zeros_like(a)
    live = (a > 0) & (p > 0)
    a, p = a[live], p[live]
    upper = p > 0.5
    target = torch.where(upper, 1 - p, p)
    z = torch.special.ndtri(p)
    start = a * (1 - 1 / (9 * a) + z * torch.sqrt(1 / (9 * a))) ** 3
    below = torch.exp((torch.log(p) + torch.lgamma(a + 1)) / a)  # P(a, x) <= x^a / Gamma(a + 1): x >= this
    y = torch.log(torch.maximum(start, below))
    lgam, log_target = torch.lgamma(a), torch.log(target)
    sign = torch.where(upper, -1.0, 1.0).to(a.dtype)
    for _ in range(NEWTON_STEPS):
        x = torch.exp(y)
        tail = torch.where(upper, torch.special.gammaincc(a, x), torch.special.gammainc(a, x))
        slope = sign * torch.exp(a * y - x - lgam) / tail  # d log(tail) / d log x; dP/dlog x = x^a e^-x / Gamma(a)
        step = (torch.log(tail) - log_target) / slope
        step = torch.where(torch.isfinite(step), step.clamp(-1.0, 1.0), -sign)  # an underflowed tail: x too far out
        y -= step
        if not bool((step.abs() > 1e-14 * torch.clamp(y.abs(), min=1.0)).any()):
            break
    out[live] = torch.exp(y)
    return out.numpy()


def compute_time(
    calls: float | np.ndarray,
    rng: np.random.Generator | np.ndarray,
    shift: float,
    rate: float,
    speed: float | np.ndarray = 1.0,
) -> float | np.ndarray:
    """Time of `calls` oracle calls: (calls*shift + Gamma(calls, 1/rate)) / speed (§2.1, (20)).

    The Gamma draw is the quantile of a uniform: `rng` is a Generator (fresh uniforms) or the
    uniforms themselves. Exactly 0.0 for zero calls; an array of call counts gives an array of
    independent times.
    """
    c = np.asarray(calls, dtype=float)
    if np.any(c < 0):
        raise ValueError(f"oracle calls must be >= 0, got {calls}")
    u = rng.random(c.shape) if isinstance(rng, np.random.Generator) else np.asarray(rng, dtype=float)
    t = (c * shift + gamma_quantile(c, u) / rate) / speed
    return float(t) if t.ndim == 0 else t


def speed_factors(num_clients: int, sigma: float, seed: int) -> np.ndarray:
    """Per-client lognormal(0, sigma) speed factors: the first num_clients draws of the stream
    (seed, SETUP, SERVER, "speed"), so a client's factor does not depend on the federation size."""
    return stream(seed, SETUP, SERVER, "speed").lognormal(0.0, sigma, num_clients)
