"""DP calibration and accountants against the closed forms and reference values of the sketching paper, algorithms/sketching/README.md,
and the RDP and exact accountants against dp-accounting (Google's DP accounting library) as the oracle.

The algorithm's own DP noise (calibration, per-batch sensitivity, noise floor) is tested in test_sketching.py."""
import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

from raysim.algorithms.sketching.privacy import (accountant_report, advanced_composition, clip_per_example, gaussian_delta, gaussian_epsilon,
                            gaussian_sigma, paper_composition, rdp_epsilon, sensitivity)


def test_gaussian_mechanism_calibration():
    """σ/Δ₂ = sqrt(2 ln(1.25/δ̂))/ε̂: 52.99 at (0.1, 1e-6), 57.17 at (0.1, 1e-7) (Lemma H.7); Δ₂ = 2C, or 2C/B for each
    batch size B."""
    assert gaussian_sigma(0.1, 1e-6, 1.0) == pytest.approx(52.988, abs=1e-3)
    assert gaussian_sigma(0.1, 1e-7, 1.0) == pytest.approx(57.17, abs=1e-2)
    assert sensitivity(0.5, 10) == 1.0 and sensitivity(0.5, 10, "batch_mean") == pytest.approx(0.1)
    np.testing.assert_allclose(sensitivity(0.5, np.array([[4, 4, 2]]), "batch_mean"), [[0.25, 0.25, 0.5]])
    np.testing.assert_allclose(sensitivity(0.5, np.array([[4, 4, 2]])), [[1.0, 1.0, 1.0]])
    with pytest.raises(ValueError, match="dp.sensitivity"):
        sensitivity(1.0, 1, "add_one")


@pytest.mark.parametrize("eps,delta,K,T,paper,rigorous", [
    (0.1, 1e-6, 5, 100, (2.236, 5e-4), (20.73, 5.1e-4)),
    (0.1, 1e-7, 1, 100, (1.0, 1e-5), (6.80, 2e-5)),
])
def test_accountants_match_spec_values(eps, delta, K, T, paper, rigorous):
    """The paper's (√(TK) ε̂, TK δ̂) and Lemma H.3 with δ' = 1e-5."""
    p = paper_composition(eps, delta, T * K)
    a = advanced_composition(eps, delta, T * K, 1e-5)
    assert p[0] == pytest.approx(paper[0], abs=1e-3) and p[1] == pytest.approx(paper[1], rel=1e-9)
    assert a[0] == pytest.approx(rigorous[0], abs=1e-2) and a[1] == pytest.approx(rigorous[1], rel=1e-9)


def test_rdp_and_exact_accountants():
    """The exact ε solves δ(ε) = δ; RDP upper-bounds it; a single H.7-calibrated step is (ε̂, δ̂)-DP exactly-or-better."""
    z = gaussian_sigma(0.1, 1e-6, 1.0)
    report = accountant_report(0.1, 1e-6, z, 500, 1e-5)
    mu = math.sqrt(500) / z
    assert gaussian_delta(mu, report["dp_eps_exact"]) == pytest.approx(report["dp_delta_advanced"], rel=1e-6)
    assert report["dp_eps_exact"] <= report["dp_eps_rdp"] <= report["dp_eps_advanced"]
    assert gaussian_epsilon(z, 1, 1e-6) <= 0.1
    assert rdp_epsilon(z, 1000, 1e-5) > rdp_epsilon(z, 100, 1e-5) > 0


# (noise multiplier z = σ/Δ₂, sampling rate, steps, δ): sampling rate 1 only, since the accountants claim no
# subsampling amplification; z = 52.99 is Lemma H.7's at (ε̂, δ̂) = (0.1, 1e-6), z = 0.7 reaches ε in the thousands.
ORACLE_GRID = [(z, 1.0, steps, delta) for z in (0.7, 1.1, 4.0, 52.99) for steps in (1, 10, 100, 1000, 10000)
               for delta in (1e-3, 1e-5, 1e-7)]


def oracle_rdp(z: float, q: float, steps: int, delta: float, orders=None) -> float:
    """dp-accounting's RDP ε of `steps` Poisson-sampled (rate q) Gaussian mechanisms of noise multiplier z."""
    accountant = RdpAccountant(orders) if orders is not None else RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize("z,q,steps,delta", ORACLE_GRID)
def test_exact_epsilon_equals_dp_accounting(z, q, steps, delta):
    """`steps` Gaussian mechanisms compose to one with σ/Δ₂ = z/√steps, whose ε dp-accounting computes
    analytically (Balle & Wang 2018): equal to 4 decimals (in fact to 1e-9) up to ε in the thousands."""
    assert q == 1.0
    assert gaussian_epsilon(z, steps, delta) == pytest.approx(dp_accounting.get_epsilon_gaussian(z / math.sqrt(steps), delta),
                                                              abs=5e-5, rel=1e-9)


@pytest.mark.parametrize("z,q,steps,delta", ORACLE_GRID)
def test_rdp_epsilon_equals_dp_accounting(z, q, steps, delta):
    """On dp-accounting's own orders the RDP curve and its conversion to (ε, δ) agree to rounding; on our finer
    default orders ε is never above dp-accounting's by more than 0.07% (it may be below: more orders near the optimum)."""
    orders = [a for a in DEFAULT_RDP_ORDERS if a > 1.01]  # dp-accounting's conversion skips α <= 1.01
    assert rdp_epsilon(z, steps, delta, np.array(orders, dtype=float)) == pytest.approx(
        oracle_rdp(z, q, steps, delta, orders), rel=1e-12)
    assert rdp_epsilon(z, steps, delta) <= oracle_rdp(z, q, steps, delta) * (1 + 7e-4)


def test_per_example_clipping():
    """Rows are scaled to norm ≤ C and keep their direction; rows already within C are unchanged."""
    g = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]], dtype=torch.float64)
    c = clip_per_example(g, 1.0)
    np.testing.assert_allclose(c.numpy(), [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]])
    big = torch.randn(50, 7, dtype=torch.float64) * 10
    assert torch.all(torch.linalg.vector_norm(clip_per_example(big, 2.0), dim=1) <= 2.0 + 1e-12)

