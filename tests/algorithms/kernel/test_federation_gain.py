"""Federation gain (specs/kernel-fedavg-fedprox.md §4, §6.15): empirical gain in the Fig. 4 setup
(converged closed-form FL models) and the Theorem 5-6 bounds as functions."""
import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from raysim.algorithms.kernel.algorithm import feature_stats, fixed_point
from raysim.algorithms.kernel.federation_gain import (coverage_threshold, empirical_gain, federation_gains, fg_bound_thm5,
                                    fg_bound_thm6, gamma_threshold, local_estimator)

ALGS = [("fedavg", 1), ("fedavg", 5), ("fedavg", 10), ("fedprox", 1)]


def fig4_trial(seed, gammas, d=100, sizes=(50,) * 10 + (500,) * 10, sigma=0.5, eta=0.1):
    """One trial of the Fig. 4 setup with the exact-Gamma generator, common random numbers across
    Gamma; FG of one random scarce and one random rich client for each algorithm, per Gamma."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=d)
    delta = rng.normal(size=(len(sizes), d))
    spread = max(np.linalg.norm(a - b) for a in delta for b in delta)
    X = [rng.normal(size=(n, d)) for n in sizes]
    noise = [sigma * rng.normal(size=n) for n in sizes]
    scarce, rich = rng.integers(0, 10), 10 + rng.integers(0, 10)
    w = np.asarray(sizes) / sum(sizes)
    out = np.zeros((len(gammas), len(ALGS), 2))
    for g, gamma in enumerate(gammas):
        stars = theta + gamma / spread * delta
        ys = [x @ t + e for x, t, e in zip(X, stars, noise)]
        S, b = zip(*[feature_stats(x, y) for x, y in zip(X, ys)])
        for a, (method, s) in enumerate(ALGS):
            fl = fixed_point(S, b, w, eta, method, s)
            for k, j in enumerate((scarce, rich)):
                out[g, a, k] = empirical_gain(local_estimator(X[j], ys[j]), fl, stars[j])
    return out


@pytest.fixture(scope="module")
def fig4():
    gammas = [0.0, 0.3, 1.0, 5.0, 20.0]
    with threadpool_limits(1):
        return gammas, np.mean([fig4_trial(seed, gammas) for seed in range(4)], axis=0)


def test_fig4_gain_at_zero_heterogeneity(fig4):
    """Spec §5.2: about 102 (scarce) and 3.7 (rich) at Gamma = 0; theory 104 and 3.68."""
    _, fg = fig4
    assert 70 < fg[0, 0, 0] < 140
    assert 2.8 < fg[0, 0, 1] < 4.8
    assert np.all(fg[:, :, 0] > fg[:, :, 1])  # scarce >> rich at every Gamma


def test_fig4_gain_decreases_in_gamma_and_algorithms_agree(fig4):
    gammas, fg = fig4
    assert np.all(np.diff(fg[:, :, 0], axis=0) < 0)
    assert np.all(np.diff(fg[:3, :, 1], axis=0) < 0)
    assert np.all(np.abs(fg / fg[:, :1, :] - 1) < 0.05)  # four algorithms within 5%
    assert fg[1, 0, 1] > 0.8 and fg[2, 0, 1] < 1  # rich crossing in (0.3, 1)
    assert fg[3, 0, 0] > 1 and fg[4, 0, 0] < 1.2  # scarce crossing around [5, 20]


def test_federation_gains_per_client_and_squared():
    rng = np.random.default_rng(0)
    d, theta = 4, rng.normal(size=4)
    Phis = [rng.normal(size=(n, d)) for n in (2, 30)]
    ys = [P @ theta + 0.1 * rng.normal(size=len(P)) for P in Phis]
    fl = theta + 0.01
    fg = federation_gains(Phis, ys, fl, [theta, theta])
    sq = federation_gains(Phis, ys, fl, [theta, theta], squared=True)
    assert np.allclose(sq, fg ** 2)
    assert local_estimator(Phis[0], ys[0]) @ np.linalg.svd(Phis[0])[2][2:].T == pytest.approx(np.zeros(2), abs=1e-12)
    assert empirical_gain(fl, fl, theta) == 1.0


def test_theorem5_bound_shape():
    d, N, sigma, B = 100, 5500, 0.5, 10.0
    g = [fg_bound_thm5(50, d, N, sigma, B, G) for G in (0, 0.1, 1, 5, 10)]
    assert np.all(np.diff(g) < 0)
    # maximum at Gamma = 0 scales like min(N/n_j, N/d) for a rich client (B large)
    assert fg_bound_thm5(500, d, N, sigma, 1e3, 0.0) == pytest.approx(N / 500)
    assert fg_bound_thm5(500, d, N, sigma, B, 0.0, kappa=2.0) == pytest.approx(fg_bound_thm5(500, d, N, sigma, B, 0.0) / 2)
    # the paper's thresholds: sqrt(1 - 50/100) * 10 = 7.07 and 0.5 sqrt(100/500) = 0.224
    assert gamma_threshold(50, d, sigma, B) == pytest.approx(7.0711, abs=1e-4)
    assert gamma_threshold(500, d, sigma, B) == pytest.approx(0.2236, abs=1e-4)


def test_theorem6_bound_shape():
    d, N, sigma, B = 100, 5500, 0.5, 10.0
    rich = [fg_bound_thm6(500, r, d, N, sigma, B) for r in (10, 40, 70, 100)]
    assert np.all(np.diff(rich) < 0)  # decreases in r_j for a data-rich client
    # at r_j = d only the local variance term is left: min(sigma^2 d/n_j, B^2) / (sigma^2 d/N)
    assert fg_bound_thm6(500, d, d, N, sigma, B) == pytest.approx(N / 500)
    assert fg_bound_thm6(5, d, d, N, sigma, B) == pytest.approx(N / 5)
    assert coverage_threshold(100) == pytest.approx(460.5, abs=0.1)
