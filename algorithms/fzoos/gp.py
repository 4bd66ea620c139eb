"""The local trajectory-informed gradient surrogate: a zero-mean GP with the SE kernel (the FZooS paper).

`fit` conditions on min-max-normalised targets (float64, coordinates centred on the point of
interest for conditioning); `mean_grad` is the closed form of eq. (5), de-normalised;
`grad_cov` is the posterior covariance of the gradient and `grad_cov_trace` its trace at a batch
of candidates in O(n^2) each, the active-query score (README). `ExactGPModel` is the same
GP in gpytorch: ML-II fitting of the length scale, and the autograd oracle of the tests.
"""
from __future__ import annotations

from dataclasses import dataclass

import gpytorch
import torch
from torch import Tensor


def se_gram(a: Tensor, b: Tensor, lengthscale: float, outputscale: float = 1.0) -> Tensor:
    """k(a, b) = s^2 exp(-|a - b|^2 / (2 l^2)) between the rows of a (m, d) and b (n, d)."""
    sq = (a * a).sum(-1)[:, None] + (b * b).sum(-1)[None, :] - 2.0 * a @ b.T
    return outputscale * torch.exp(-sq.clamp_min(0.0) / (2.0 * lengthscale**2))


@dataclass
class GradientGP:
    """A GP posterior on n points: data X - center, the inverse A of (K + sigma^2 I), alpha = A y~."""

    center: Tensor
    X: Tensor  # (n, d), centred
    A: Tensor  # (n, n)
    alpha: Tensor  # (n,)
    y_range: float
    lengthscale: float
    outputscale: float

    @property
    def kappa(self) -> float:
        """The prior gradient variance per coordinate, s^2 / l^2."""
        return self.outputscale / self.lengthscale**2


def normalise(y: Tensor) -> tuple[Tensor, float]:
    """Min-max scaling of the targets to [0, 1] and the range to de-normalise gradients (as the official code does)."""
    lo, span = y.min(), float(y.max() - y.min())
    return (y - lo) / (span + 1e-20), span


def fit(X: Tensor, y: Tensor | None, lengthscale: float, noise: float, center: Tensor,
        outputscale: float = 1.0) -> GradientGP:
    """Condition on (X, y); with y None only the covariance (the active-query score) is available."""
    Xc = X - center
    K = se_gram(Xc, Xc, lengthscale, outputscale)
    K.diagonal().add_(noise)
    L, info = torch.linalg.cholesky_ex(K)
    if int(info):
        L = torch.linalg.cholesky(K + 1e-10 * torch.eye(len(K), dtype=K.dtype))
    A = torch.cholesky_inverse(L)
    if y is None:
        alpha, span = torch.zeros(len(X), dtype=X.dtype), 0.0
    else:
        yn, span = normalise(y)
        alpha = torch.cholesky_solve(yn[:, None], L)[:, 0]
    return GradientGP(center, Xc, A, alpha, span, lengthscale, outputscale)


def mean_grad(gp: GradientGP, x: Tensor) -> Tensor:
    """Eq. (5): grad mu(x) = (1/l^2) sum_t alpha_t k(x, x_t) (x_t - x), times the target range."""
    xc = (x - gp.center)[None]
    k = se_gram(xc, gp.X, gp.lengthscale, gp.outputscale)[0]
    return gp.y_range * ((gp.alpha * k) @ (gp.X - xc)) / gp.lengthscale**2


def _jacobian(gp: GradientGP, x: Tensor) -> Tensor:
    """J(x) (n, d): rows -k(x, x_t)(x - x_t) / l^2."""
    xc = (x - gp.center)[None]
    k = se_gram(xc, gp.X, gp.lengthscale, gp.outputscale)[0]
    return -k[:, None] * (xc - gp.X) / gp.lengthscale**2


def grad_cov(gp: GradientGP, x: Tensor) -> Tensor:
    """Sigma_grad(x) = (s^2/l^2) I - J^T A J, the posterior covariance of the gradient (d, d), normalised units."""
    J = _jacobian(gp, x)
    return gp.kappa * torch.eye(J.shape[1], dtype=J.dtype) - J.T @ gp.A @ J


def grad_cov_trace(gp: GradientGP, C: Tensor) -> Tensor:
    """tr Sigma_grad(c) for candidates C (m, d): d s^2/l^2 - l^-4 [|c|^2 k'Ak - 2 (k*p)'Ak + k'(A*H)k] (eq. (4)'s covariance)."""
    Cc = C - gp.center
    k = se_gram(Cc, gp.X, gp.lengthscale, gp.outputscale)
    Ak = k @ gp.A
    p = Cc @ gp.X.T
    H = gp.X @ gp.X.T
    quad = ((Cc * Cc).sum(-1) * (Ak * k).sum(-1) - 2.0 * ((k * p) * Ak).sum(-1)
            + ((k @ (gp.A * H)) * k).sum(-1))
    return C.shape[1] * gp.kappa - quad / gp.lengthscale**4


def grad_var_first(gp: GradientGP, C: Tensor) -> Tensor:
    """Sigma_grad(c)[0, 0], the variance of df/dx_1: the official code's active-query score."""
    Cc = C - gp.center
    k = se_gram(Cc, gp.X, gp.lengthscale, gp.outputscale)
    j = -k * (Cc[:, :1] - gp.X[:, 0][None]) / gp.lengthscale**2
    return gp.kappa - ((j @ gp.A) * j).sum(-1)


class ExactGPModel(gpytorch.models.ExactGP):
    """The same GP in gpytorch: zero mean, RBF kernel of amplitude 1, Gaussian likelihood."""

    def __init__(self, X: Tensor, y: Tensor, lengthscale: float, noise: float):
        likelihood = gpytorch.likelihoods.GaussianLikelihood(
            noise_constraint=gpytorch.constraints.GreaterThan(min(noise, 1e-4) / 10))
        super().__init__(X, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.RBFKernel()
        self.double()
        self.covar_module.lengthscale = lengthscale
        self.likelihood.noise = noise

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def fit_lengthscale(X: Tensor, y: Tensor, lengthscale: float, noise: float, steps: int, lr: float = 0.1) -> float:
    """ML-II: Adam on gpytorch's exact marginal likelihood of the normalised targets, noise held fixed."""
    model = ExactGPModel(X - X.mean(0), normalise(y)[0], lengthscale, noise)
    model.train()
    model.likelihood.raw_noise.requires_grad_(False)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    opt = torch.optim.Adam([model.covar_module.raw_lengthscale], lr=lr)
    with gpytorch.settings.cholesky_jitter(double_value=1e-10):
        for _ in range(steps):
            opt.zero_grad()
            loss = -mll(model(*model.train_inputs), model.train_targets)
            loss.backward()
            opt.step()
    return float(model.covar_module.lengthscale.detach())
