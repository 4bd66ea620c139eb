"""The GP gradient surrogate against gpytorch autograd, finite differences and the properties of
FZooS, algorithms/fzoos/README.md (eq. (4)-(5), Lemma C.6)."""
import math

import numpy as np
import pytest
import torch

from raysim.algorithms.fzoos import gp
from raysim.algorithms.fzoos.estimators import directions, fd_gradient
from raysim.algorithms.fzoos.objectives import Quadratic

D = torch.float64


def points(n, d, radius, seed, center=None):
    g = torch.Generator().manual_seed(seed)
    center = torch.full((d,), 0.5, dtype=D) if center is None else center
    return center + radius * (2 * torch.rand(n, d, dtype=D, generator=g) - 1)


def test_closed_form_gradient_equals_gpytorch_autograd_and_central_differences():
    """Eq. (5) in closed form == autograd of gpytorch's posterior mean == central FD of mu (< 1e-6)."""
    X = points(40, 6, 0.8, 0)
    y = torch.sin(3 * X).sum(1) + X[:, 0] ** 2
    x = points(1, 6, 0.3, 1)[0]
    model = gp.fit(X, y, lengthscale=0.7, noise=1e-6, center=x)
    closed = gp.mean_grad(model, x)

    yn, span = gp.normalise(y)
    exact = gp.ExactGPModel(X, yn, 0.7, 1e-6).eval()
    xr = x.clone().requires_grad_(True)
    exact.likelihood.eval()
    (auto,) = torch.autograd.grad(exact(xr[None]).mean.sum(), xr)
    auto = span * auto

    def mu(z):
        k = gp.se_gram(z[None] - model.center, model.X, 0.7)[0]
        return span * float(k @ model.alpha)

    h = 1e-5
    central = torch.tensor([(mu(x + e) - mu(x - e)) / (2 * h) for e in torch.eye(6, dtype=D) * h], dtype=D)
    assert torch.norm(closed - auto) / torch.norm(auto) < 1e-6
    assert torch.norm(closed - central) / torch.norm(central) < 1e-6


@pytest.fixture(scope="module")
def trajectory_gp():
    """30 trajectory-like points (a +-0.03 box) in d = 40: n < d."""
    X = points(30, 40, 0.03, 2)
    return gp.fit(X, (X**2).sum(1), 1.0, 1e-6, center=X[0])


def test_gradient_covariance_is_psd_below_kappa_and_spectral_norm_is_kappa(trajectory_gp):
    """Sigma_grad symmetric PSD, <= kappa I; for n < d its largest eigenvalue is exactly kappa."""
    for x in points(5, 40, 0.02, 3):
        S = gp.grad_cov(trajectory_gp, x)
        assert torch.allclose(S, S.T, atol=1e-12)
        eig = torch.linalg.eigvalsh(S)
        assert eig.min() > -1e-8 and eig.max() < trajectory_gp.kappa + 1e-8
        assert eig.max() == pytest.approx(trajectory_gp.kappa, abs=1e-8)


def test_vectorised_trace_and_first_coordinate_match_the_matrix(trajectory_gp):
    C = points(8, 40, 0.02, 4)
    traces = gp.grad_cov_trace(trajectory_gp, C)
    firsts = gp.grad_var_first(trajectory_gp, C)
    for c, tr, f in zip(C, traces, firsts):
        S = gp.grad_cov(trajectory_gp, c)
        assert float(tr) == pytest.approx(float(torch.trace(S)), rel=1e-9)
        assert float(f) == pytest.approx(float(S[0, 0]), abs=1e-9)
    assert float(traces.max() - traces.min()) > 1e-3  # the trace ranks candidates, the spectral norm cannot


def test_trace_never_increases_when_points_are_added_and_prior_far_away():
    """tr Sigma_grad(x) is non-increasing in the data (rho_i <= 1); far from the data it is d*kappa."""
    X = points(25, 10, 0.1, 5)
    x = points(1, 10, 0.05, 6)[0]
    traces = [float(gp.grad_cov_trace(gp.fit(X[:n], None, 1.0, 1e-6, center=x), x[None])[0]) for n in range(1, 26)]
    assert all(b <= a + 1e-9 for a, b in zip(traces, traces[1:]))
    far = gp.grad_cov(gp.fit(X, None, 1.0, 1e-6, center=x), x + 50.0)
    assert torch.allclose(far, torch.eye(10, dtype=D), atol=1e-12)


def test_one_point_shrinks_the_trace_at_most_by_the_lemma_c6_factor_at_a_noise_where_it_binds():
    """Lemma C.6: a new point multiplies tr Sigma_grad(x) by at least 1/(1 + 1/sigma^2), vacuous (~1e-6) at
    sigma^2 = 1e-6; at sigma^2 = 1 it is 1/2, and the SE kernel (value-gradient correlation at most e^{-1/2})
    reaches about 0.74. By hand (d = 1, l = 1, x = 0.5): a point at x + 1 gives tr = 1 - e^{-1}/(1 + sigma^2)
    = 0.8160603; then x - 1 ((1, -1) is an eigenvector of K + sigma^2 I, eigenvalue 1 + sigma^2 - e^{-2}) gives
    tr = 1 - 2 e^{-1}/(1 + sigma^2 - e^{-2}) = 0.6054203, a ratio of 0.7418818."""
    noise, bound = 1.0, 0.5
    x = torch.tensor([0.5], dtype=D)
    X = torch.tensor([[1.5], [-0.5]], dtype=D)
    traces = [float(gp.grad_cov_trace(gp.fit(X[:n], None, 1.0, noise, center=x), x[None])[0]) for n in (1, 2)]
    assert traces == pytest.approx([0.8160603, 0.6054203], abs=1e-7)
    assert bound <= traces[1] / traces[0] < 1.5 * bound
    for d in (1, 2, 3):
        X = points(30, d, 1.0, 9, center=torch.full((d,), 0.5, dtype=D))
        xd = torch.full((d,), 0.5, dtype=D)
        tr = [float(d)] + [float(gp.grad_cov_trace(gp.fit(X[:n], None, 1.0, noise, center=xd), xd[None])[0])
                           for n in range(1, 31)]
        ratios = [b / a for a, b in zip(tr, tr[1:])]
        assert bound <= min(ratios) and max(ratios) <= 1.0 + 1e-12


def test_gp_gradient_from_150_points_beats_finite_differences_in_d300():
    """GP vs FD: 150 points (+-0.03 box) in d = 300: GP cosine ~0.69 (sqrt(149/300) = 0.705) vs FD Q=20 ~0.25."""
    q = Quadratic(300, 5, 5.0, seed=0)
    x0 = q.x0
    X = points(150, 300, 0.03, 7, center=x0)
    model = gp.fit(X, q.local(0, X), 1.0, 1e-6, center=x0)
    true = q.local_grad(0, x0)
    cos_gp = float(torch.nn.functional.cosine_similarity(gp.mean_grad(model, x0), true, dim=0))
    rng = np.random.default_rng(0)
    cos_fd = np.mean([float(torch.nn.functional.cosine_similarity(
        fd_gradient(lambda u: q.local(0, u), x0, q.local(0, x0[None])[0], directions(300, 20, "gaussian", rng),
                    0.01, "inv_q"), true, dim=0)) for _ in range(20)])
    assert 0.6 < cos_gp < 0.78
    assert abs(cos_fd - math.sqrt(20 / 300)) < 0.05
    assert cos_gp > 2.4 * cos_fd


@pytest.mark.slow
def test_ml2_recovers_the_length_scale_of_a_gp_sample():
    g = torch.Generator().manual_seed(8)
    X = torch.rand(40, 2, dtype=D, generator=g)
    K = gp.se_gram(X, X, 0.3) + 1e-8 * torch.eye(40, dtype=D)
    y = torch.linalg.cholesky(K) @ torch.randn(40, dtype=D, generator=g)
    assert 0.15 < gp.fit_lengthscale(X, y, 1.0, 1e-6, steps=40, lr=0.1) < 0.6
