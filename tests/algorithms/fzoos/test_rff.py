"""Random-Fourier-feature compression against the exact kernel and GP (FZooS, algorithms/fzoos/README.md)."""
import hashlib

import numpy as np
import torch

from raysim.algorithms.fzoos import gp, rff
from raysim.algorithms.fzoos.objectives import Quadratic

D = torch.float64


def box(n, d, radius, seed, center):
    g = torch.Generator().manual_seed(seed)
    return center + radius * (2 * torch.rand(n, d, dtype=D, generator=g) - 1)


def digest(rf):
    return hashlib.sha256(rf.V.numpy().tobytes() + rf.b.numpy().tobytes()).hexdigest()


def test_kernel_error_shrinks_like_inverse_sqrt_m():
    """Lemma C.3: d = 300, 200 points in a +-0.05 box: mean |Phi Phi' - K| < 0.01 at M = 1e4, ~sqrt(10)x less than at 1e3."""
    X = box(200, 300, 0.05, 0, torch.full((300,), 0.5, dtype=D))
    K = gp.se_gram(X, X, 1.0)
    err = {}
    for m in (1000, 10_000):
        Phi = rff.features(rff.shared_features(1, m, 300, 1.0), X)
        err[m] = float((Phi @ Phi.T - K).abs().mean())
    assert err[10_000] < 0.01
    assert 2.0 < err[1000] / err[10_000] < 5.0


def test_surrogate_gradient_approaches_the_exact_gp_mean_gradient():
    """Lemma C.4: 150 trajectory points (+-0.03 box), 20 test points (+-0.02), quadratic client 0, C = 5:
    the RFF gradient's error falls with M and its cosine to the exact GP gradient is > 0.95 at M = 1e4."""
    q = Quadratic(300, 5, 5.0, seed=0)
    X = box(150, 300, 0.03, 1, q.x0)
    y = q.local(0, X)
    tests = box(20, 300, 0.02, 2, q.x0)
    exact = [gp.mean_grad(gp.fit(X, y, 1.0, 1e-6, center=q.x0), x) for x in tests]
    rel, cos = {}, {}
    for m in (1000, 10_000):
        rf = rff.shared_features(0, m, 300, 1.0)
        w = rff.fit_weights(rf, X, y, 1e-6)
        approx = [rff.surrogate_grad(rf, w, x) for x in tests]
        rel[m] = np.mean([float(torch.norm(a - e) / torch.norm(e)) for a, e in zip(approx, exact)])
        cos[m] = np.mean([float(torch.nn.functional.cosine_similarity(a, e, dim=0)) for a, e in zip(approx, exact)])
    assert rel[10_000] < rel[1000]
    assert cos[10_000] > 0.95


def test_weights_interpolate_and_average_linearly():
    """The de-normalised fit interpolates y - min y; eq. (7): grad of the mean weights = mean of the gradients."""
    rf = rff.shared_features(3, 2000, 5, 1.0)
    X = box(12, 5, 0.5, 4, torch.full((5,), 0.5, dtype=D))
    ws = [rff.fit_weights(rf, X, X[:, i] ** 2 + i, 1e-6) for i in range(3)]
    y = X[:, 0] ** 2
    assert torch.allclose(rff.features(rf, X) @ ws[0], y - y.min(), atol=1e-3)
    x = X[0] + 0.01
    mean_of_grads = torch.stack([rff.surrogate_grad(rf, w, x) for w in ws]).mean(0)
    assert torch.allclose(rff.surrogate_grad(rf, torch.stack(ws).mean(0), x), mean_of_grads, atol=1e-12)


def test_features_are_a_pure_function_of_the_seed():
    a = rff.shared_features(5, 300, 7, 1.0)
    rff.shared_features.cache_clear()
    b = rff.shared_features(5, 300, 7, 1.0)
    assert a is not b and digest(a) == digest(b)
    assert digest(rff.shared_features(6, 300, 7, 1.0)) != digest(a)
    assert abs(float(a.V.std()) - 1.0) < 0.05 and 0 <= float(a.b.min()) and float(a.b.max()) <= 2 * np.pi
