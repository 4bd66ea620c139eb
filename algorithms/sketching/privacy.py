"""Differential privacy for PrivateIterativeSketchingFL (Algorithm 2; the sketching paper).

Calibration: the Gaussian mechanism of Lemma H.7, σ = sqrt(2 ln(1.25/δ̂)) Δ₂ / ε̂, with Δ₂ = 2C
for per-example clipping at C under replace-one adjacency (README). Accountants over the
T·K noisy steps a client runs (clients hold disjoint data, so parallel composition H.2 makes the
per-client figure the run's figure; sketching and averaging are post-processing, H.5):
  * `paper_composition`: Theorem 6.2 as stated in the paper, (√(TK) ε̂, TK δ̂);
  * `advanced_composition`: Lemma H.3 applied once to all TK steps, the rigorous closed form;
  * `rdp_epsilon`: a Rényi-DP (moments) accountant of the composed Gaussian mechanisms;
  * `gaussian_epsilon`: the exact (ε, δ) curve of the composition (it is one Gaussian mechanism).
No subsampling amplification is claimed (the paper's final theorem does not use it).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.stats import norm


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """σ of Lemma H.7's Gaussian mechanism, sqrt(2 ln(1.25/δ)) Δ₂ / ε; (ε, δ)-DP only for ε < 1."""
    if epsilon <= 0 or not 0 < delta < 1 or sensitivity < 0:
        raise ValueError(f"dp: need epsilon > 0, delta in (0, 1), sensitivity >= 0 (got {epsilon}, {delta}, {sensitivity})")
    return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon


def sensitivity(clip: float, batch_size: int | np.ndarray, kind: str = "replace_one") -> float | np.ndarray:
    """Δ₂ of a clipped minibatch mean over `batch_size` examples (elementwise for an array of actual sizes):
    2C (`replace_one`, valid at any batch size, the default) or 2C/B (`batch_mean`, B the batch's own size)."""
    sizes = np.asarray(batch_size, dtype=float)
    if kind == "replace_one":
        return 2.0 * clip * np.ones_like(sizes)
    if kind == "batch_mean":
        return 2.0 * clip / sizes
    raise ValueError(f"dp.sensitivity: unknown {kind!r}; allowed: ['batch_mean', 'replace_one']")


def clip_per_example(grads: torch.Tensor, clip: float) -> torch.Tensor:
    """Scale each row g_i (shape [..., n, d]) to norm at most C: g_i · min(1, C / ‖g_i‖)."""
    norms = torch.linalg.vector_norm(grads, dim=-1, keepdim=True)
    return grads * torch.clamp(clip / norms.clamp_min(torch.finfo(grads.dtype).tiny), max=1.0)


def paper_composition(eps_step: float, delta_step: float, steps: int) -> tuple[float, float]:
    """Theorem 6.2 as stated in the paper: (√(TK) ε̂, TK δ̂), with `steps` = TK (not rigorous, README)."""
    return math.sqrt(steps) * eps_step, steps * delta_step


def advanced_composition(eps_step: float, delta_step: float, steps: int, delta_prime: float) -> tuple[float, float]:
    """Lemma H.3 over k = `steps` mechanisms: (sqrt(2k ln(1/δ')) ε̂ + 2k ε̂², δ' + k δ̂) (README)."""
    return (math.sqrt(2.0 * steps * math.log(1.0 / delta_prime)) * eps_step + 2.0 * steps * eps_step**2,
            delta_prime + steps * delta_step)


def rdp_epsilon(noise_multiplier: float, steps: int, delta: float, orders: np.ndarray | None = None) -> float:
    """(ε, δ) from Rényi DP: `steps` Gaussian mechanisms of σ/Δ₂ = z compose to RDP α·steps/(2z²);
    converted with ε = RDP(α) + ln((α−1)/α) − (ln δ + ln α)/(α−1) (Balle et al. 2020), minimised over α."""
    if steps == 0:
        return 0.0
    a = np.concatenate([np.linspace(1.01, 10, 200), np.geomspace(10, 1e5, 400)]) if orders is None else orders
    rdp = a * steps / (2.0 * noise_multiplier**2)
    eps = rdp + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)
    return float(max(0.0, eps.min()))


def gaussian_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of a Gaussian mechanism with sensitivity/σ = μ (Balle & Wang 2018, Thm 8): exact, tight; e^ε Φ(·)
    is taken in log space, so a large ε (a large μ) does not overflow."""
    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon + norm.logcdf(-epsilon / mu - mu / 2)))


def gaussian_epsilon(noise_multiplier: float, steps: int, delta: float) -> float:
    """The exact ε at `delta` of `steps` composed Gaussian mechanisms of σ/Δ₂ = z (one mechanism with μ = √steps / z)."""
    if steps == 0:
        return 0.0
    mu = math.sqrt(steps) / noise_multiplier
    if gaussian_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(mu, hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gaussian_delta(mu, e) - delta, 0.0, hi, xtol=1e-12))


def accountant_report(eps_step: float, delta_step: float, noise_multiplier: float, steps: int,
                      delta_prime: float) -> dict[str, float]:
    """All four figures after `steps` = TK noisy steps; RDP and exact ε are at the rigorous total δ."""
    eps_p, delta_p = paper_composition(eps_step, delta_step, steps)
    eps_a, delta_a = advanced_composition(eps_step, delta_step, steps, delta_prime)
    return {"dp_eps_paper": eps_p, "dp_delta_paper": delta_p, "dp_eps_advanced": eps_a, "dp_delta_advanced": delta_a,
            "dp_eps_rdp": rdp_epsilon(noise_multiplier, steps, delta_a),
            "dp_eps_exact": gaussian_epsilon(noise_multiplier, steps, delta_a)}
