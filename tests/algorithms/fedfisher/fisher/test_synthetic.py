"""FedFisher's synthetic two-layer experiment (FedFisher, algorithms/fedfisher/README.md)."""
import math

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from raysim.algorithms.fedfisher.fisher.synthetic import (experiment, features, fedavg, fedfisher_spectral, global_error, init_network,
                                     local_gd, local_loss, make_data, method_name, predict, proxy_system)


@pytest.fixture(autouse=True)
def one_thread():
    with threadpool_limits(1):
        yield


def trained(width, n, steps, seed=0, identical=False):
    """Data, network and K-step local models of a small M = 2 problem."""
    rng = np.random.default_rng(seed)
    x, y = make_data(rng, clients=2, n=n)
    if identical:
        x, y = np.stack([x[0], x[0]]), np.stack([y[0], y[0]])
    a, w0 = init_network(rng, width)
    local = np.stack([local_gd(a, w0, xi, yi, steps) for xi, yi in zip(x, y)])
    return a, x, y, local


def numerical_gradient(fn, w, h=1e-6):
    """Central differences of a function of a weight matrix, in row-major vec(W) order."""
    grads = []
    for k in range(w.size):
        e = np.zeros(w.size)
        e[k] = h
        grads.append((fn(w + e.reshape(w.shape)) - fn(w - e.reshape(w.shape))) / (2 * h))
    return np.stack(grads, axis=-1)


def test_data_follows_the_generator():
    """Unit-norm inputs; per client y is exactly linear in x (y = w_i·x, no noise); draws depend on the rng only."""
    x, y = make_data(np.random.default_rng(3), clients=2, n=50)
    assert x.shape == (2, 50, 2) and y.shape == (2, 50)
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-15)
    for xi, yi in zip(x, y):
        coef = np.linalg.lstsq(xi, yi, rcond=None)[0]
        np.testing.assert_allclose(xi @ coef, yi, atol=1e-12)
    x2, y2 = make_data(np.random.default_rng(3), clients=2, n=50)
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    a, w0 = init_network(np.random.default_rng(0), 4096)
    np.testing.assert_allclose(np.abs(a), 1 / 64)
    assert abs(w0.var() - 0.5) < 0.02


def test_features_are_the_gradient_and_the_fisher_is_a_gram_matrix():
    """φ = ∇_W f (finite differences), f = φ·vec(W) (homogeneity), and the true Fisher of y|x ~ N(f, 1) at W̃_i,
    E_y[∇log p ∇log pᵀ] = (1/n) Σ_j ∇f ∇fᵀ, built sample by sample, equals Ã_iᵀÃ_i/n of proxy_system (Claim 2)."""
    n = 12
    a, x, y, local = trained(width=5, n=n, steps=30)
    big_a, y_tilde = proxy_system(a, local, x)
    for i, (w, xi) in enumerate(zip(local, x)):
        grads = numerical_gradient(lambda v: predict(a, v, xi), w)
        np.testing.assert_allclose(features(a, w, xi), grads, atol=1e-8)
        np.testing.assert_allclose(features(a, w, xi) @ w.reshape(-1), predict(a, w, xi), atol=1e-14)
        fisher = sum(np.outer(g, g) for g in grads) / n
        block = big_a[i * n:(i + 1) * n]
        np.testing.assert_allclose(block.T @ block / n, fisher, atol=1e-8)
        np.testing.assert_allclose(y_tilde[i * n:(i + 1) * n], predict(a, w, xi), atol=1e-14)


@pytest.mark.parametrize("width, n, steps", [(6, 8, 37), (16, 8, 200), (3, 10, 1)])
def test_spectral_filter_equals_explicit_server_gd(width, n, steps):
    """T explicit steps W ← W − η_S Σ_i F_i (W − W̃_i) from W̄ (Alg. 1), with F_i = (1/n) Σ_j φ_ij φ_ijᵀ summed sample
    by sample, equal the closed-form filter (README) to 1e-10 (d < N, d > N and T = 1)."""
    a, x, y, local = trained(width, n, steps=40)
    fishers = [sum(np.outer(f, f) for f in features(a, w, xi)) / n for w, xi in zip(local, x)]
    server_lr = 0.9 / np.linalg.eigvalsh(sum(fishers)).max()
    w = fedavg(local).reshape(-1)
    for _ in range(steps):
        w = w - server_lr * sum(f @ (w - wl.reshape(-1)) for f, wl in zip(fishers, local))
    big_a, y_tilde = proxy_system(a, local, x)
    closed = fedfisher_spectral(big_a, y_tilde, fedavg(local), n, steps, server_lr)
    np.testing.assert_allclose(closed, w, atol=1e-10)


def test_pinv_limit_reproduces_the_local_predictions():
    """With Ã of full row rank (d = 128 > N = 20), T = ∞ gives Ã W* = ỹ: the proxy outputs reproduce every local
    model's predictions on its own data (eq. (96)), to 1e-8; W* = W̄ + F⁺(b − F W̄) (Lemma 1's proof) and long GD converges
    to it (Lemma 1)."""
    n = 10
    a, x, y, local = trained(width=64, n=n, steps=100)
    big_a, y_tilde = proxy_system(a, local, x)
    s = np.linalg.svd(big_a, compute_uv=False)
    assert s.min() > 1e-4 * s.max()
    w_bar = fedavg(local)
    w_star = fedfisher_spectral(big_a, y_tilde, w_bar, n, math.inf)
    for i, (w, xi) in enumerate(zip(local, x)):
        np.testing.assert_allclose(features(a, w, xi) @ w_star, predict(a, w, xi), atol=1e-8)
    fisher = big_a.T @ big_a / n
    b = sum(features(a, w, xi).T @ predict(a, w, xi) for w, xi in zip(local, x)) / n
    w_flat = w_bar.reshape(-1)
    reference = w_flat + np.linalg.pinv(fisher, hermitian=True) @ (b - fisher @ w_flat)
    np.testing.assert_allclose(w_star, reference, atol=1e-8)
    long_gd = fedfisher_spectral(big_a, y_tilde, w_bar, n, 1e9, server_lr=n / s.max() ** 2)
    np.testing.assert_allclose(long_gd, w_star, atol=1e-8)


@pytest.mark.parametrize("steps", [1, 1e4, math.inf])
def test_identical_clients_give_the_common_model(steps):
    """Identical data ⇒ identical local models ⇒ FedFisher = FedAvg = that model."""
    a, x, y, local = trained(width=16, n=20, steps=50, identical=True)
    assert np.array_equal(local[0], local[1])
    w_bar = fedavg(local)
    np.testing.assert_array_equal(w_bar, local[0])
    big_a, y_tilde = proxy_system(a, local, x)
    np.testing.assert_allclose(fedfisher_spectral(big_a, y_tilde, w_bar, 20, steps), local[0].reshape(-1), atol=1e-12)


def test_local_gd_follows_the_local_loss_gradient_and_decreases_it():
    """One step is W − η ∇L_i with L_i = (1/n) Σ ½(f − y)² (finite differences); the loss falls at every step."""
    a, x, y, _ = trained(width=32, n=30, steps=0)
    _, w0 = init_network(np.random.default_rng(1), 32)
    grad = numerical_gradient(lambda v: local_loss(a, v, x[0], y[0]), w0)
    np.testing.assert_allclose(local_gd(a, w0, x[0], y[0], 1, lr=0.1).reshape(-1), w0.reshape(-1) - 0.1 * grad,
                               atol=1e-8)
    losses, w = [local_loss(a, w0, x[0], y[0])], w0
    for _ in range(300):
        w = local_gd(a, w, x[0], y[0], 1)
        losses.append(local_loss(a, w, x[0], y[0]))
    assert np.all(np.diff(losses) <= 1e-15)
    assert losses[-1] < 0.2 * losses[0]


def test_spectral_rejects_an_unstable_server_step():
    a, x, y, local = trained(width=4, n=5, steps=3)
    big_a, y_tilde = proxy_system(a, local, x)
    with pytest.raises(ValueError, match="server_lr"):
        fedfisher_spectral(big_a, y_tilde, fedavg(local), 5, 10, server_lr=100.0)


def test_experiment_reports_every_method_and_is_reproducible():
    """Keys per method; same seed ⇒ same numbers; at K = 0 both local models are W0, so FedAvg's error = local fit."""
    out = experiment(width=8, steps=20, seed=1, server_steps=(10, math.inf))
    assert set(out) == {"fedavg", "local_fit", method_name(10), method_name(math.inf)}
    assert out == experiment(width=8, steps=20, seed=1, server_steps=(10, math.inf))
    assert all(np.isfinite(v) and v >= 0 for v in out.values())
    assert method_name(1e5) == "fedfisher_T=100000" and method_name(math.inf) == "fedfisher_T=inf"
    start = experiment(width=8, steps=0, seed=1, server_steps=())
    assert start["fedavg"] == pytest.approx(start["local_fit"])


def test_global_error_is_the_mean_over_all_points():
    a, x, y, local = trained(width=8, n=7, steps=5)
    expected = np.mean(np.concatenate([(predict(a, local[0], xi) - yi) ** 2 for xi, yi in zip(x, y)]))
    assert global_error(a, local[0], x, y) == pytest.approx(expected, rel=1e-14)


@pytest.mark.slow
def test_fig1_qualitative_targets():
    """Fig. 1's trends on 10-seed means (sd across seeds ≈ 0.7-0.9, so 5 seeds can flip neighbouring points):
    (a) at K = 2048 the finite-T FedFisher error is non-increasing in m ∈ {32, 128, 512, 2048};
    (b) at m = 512 the T = 1e5 error is U-shaped in K ∈ {16, ..., 4096} with its minimum at K ∈ {64, 256};
    (c) FedFisher (T = 1e4, 1e5) < FedAvg at every m ≥ 512 (K = 2048) and every K ≥ 64 (m = 512)."""
    seeds = range(10)
    finite = [method_name(1e4), method_name(1e5)]

    def means(width, steps):
        runs = [experiment(width, steps, seed, server_steps=(1e4, 1e5)) for seed in seeds]
        return {k: float(np.mean([r[k] for r in runs])) for k in runs[0]}

    by_width = {m: means(m, 2048) for m in (32, 128, 512, 2048)}
    by_steps = {k: means(512, k) for k in (16, 64, 256, 1024, 4096)}
    for method in finite:
        curve = [by_width[m][method] for m in sorted(by_width)]
        assert np.all(np.diff(curve) <= 0), (method, curve)
    curve = {k: r[method_name(1e5)] for k, r in by_steps.items()}
    best = min(curve, key=curve.get)
    assert best in (64, 256), curve
    assert curve[16] > curve[best] and curve[4096] > curve[best], curve
    points = [by_width[512], by_width[2048]] + [by_steps[k] for k in (64, 256, 1024, 4096)]
    for r in points:
        assert all(r[method] < r["fedavg"] for method in finite), r
