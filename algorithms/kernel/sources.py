"""Regression generators of the nonparametric FedAvg/FedProx paper (the kernel FedAvg/FedProx paper).

Each model is a pure function `(sizes, ..., rng) -> RegressionData`: per client i its covariates
x_i, noisy responses y_i = f_i*(x_i) + sigma xi, the noise-free truth f_i*(x_i), and, for the
finite-rank models, the truth coefficients theta_i*. The figure sweeps call these directly.

As registered data sources (natural partitions: client i is the paper's client i, unbalanced
sizes `data.options.sizes` cycled over the clients) the targets are float64 rows
y = [response, f_i*(x)], followed for the finite-rank models by the D truth coefficients theta_i*
of the row's client: clients train on the response only; the rest is the evaluation-only oracle,
so evaluate() measures errors against f* without noise, and the federation gain of a
data-scarce client (n_j < D, whose n_j truth values cannot pin theta_j* down) is defined. Each
client draws extra rows so that after the natural holdout (floor(test_fraction * rows) of each
client go to the server's test set) exactly sizes[i] training samples remain; the test rows are
fresh draws from the clients' own distributions, with their noise-free truth.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from raysim.core.rng import SERVER, SETUP, stream
from raysim.data.sources import Source, register_source
from raysim.errors import DataError

if TYPE_CHECKING:
    from raysim.data.config import DataConfig

class RegressionOptions(BaseModel):
    """`data.options:` of the regression generators (the kernel FedAvg/FedProx paper)."""

    model_config = ConfigDict(extra="forbid")

    sizes: list[int] = Field(default_factory=lambda: [500], min_length=1,
                             description="training samples of client i: sizes[i % len(sizes)] (unbalanced: [50, 500])")
    dim: int = Field(100, ge=1, description="d of the linear and subspace models")
    noise: float = Field(0.5, ge=0, description="sigma of the Gaussian response noise")
    heterogeneity: float = Field(0.0, ge=0, description="Gamma = max_ij ||theta_i* - theta_j*|| (linear model)")
    heterogeneity_kind: Literal["exact", "radius"] = Field("exact", description="exact: realised Gamma; radius: theta* + Gamma u_i")
    rank: int | None = Field(None, ge=1, description="r of the subspace model (None: dim)")
    grid: Literal["midpoint", "left"] = Field("midpoint", description="covariate grid of the polynomial model")

    @field_validator("sizes")
    @classmethod
    def _positive(cls, sizes: list[int]) -> list[int]:
        if min(sizes) < 1:
            raise ValueError("every client needs at least one sample")
        return sizes


CHEBYSHEV_U5 = np.array([0.0, 6.0, 0.0, -32.0, 0.0, 32.0])  # U_5(x) = 32x^5 - 32x^3 + 6x, monomial basis


@dataclass
class RegressionData:
    """Per-client samples: x[i] (n_i, p), y[i] and truth[i] (n_i,), theta (M, D) or None."""

    x: list[np.ndarray]
    y: list[np.ndarray]
    truth: list[np.ndarray]
    theta: np.ndarray | None = None

    @property
    def sizes(self) -> np.ndarray:
        return np.array([len(t) for t in self.truth], dtype=np.int64)


def _noisy(truth: list[np.ndarray], sigma: float, rng: np.random.Generator) -> list[np.ndarray]:
    return [t + sigma * rng.standard_normal(len(t)) for t in truth]


def heterogeneous_truths(theta: np.ndarray, num_clients: int, gamma: float, kind: str,
                         rng: np.random.Generator) -> np.ndarray:
    """theta_i* around theta* (Sec. 6.2). exact: theta* + delta_i, delta_i ~ N(0, I) rescaled so that
    max_ij ||delta_i - delta_j|| = Gamma; radius: theta* + Gamma u_i, u_i uniform on the sphere."""
    d = len(theta)
    delta = rng.standard_normal((num_clients, d))
    if kind == "radius":
        delta /= np.linalg.norm(delta, axis=1, keepdims=True)
        return theta + gamma * delta
    if gamma == 0.0:
        return np.tile(theta, (num_clients, 1))
    if num_clients < 2:
        raise DataError("data.options.heterogeneity: Gamma > 0 needs at least two clients")
    spread = max(np.linalg.norm(delta[:, None, :] - delta[None, :, :], axis=2).max(), 1e-300)
    return theta + (gamma / spread) * delta


def linear_model(sizes, d: int, sigma: float, gamma: float, kind: str, rng: np.random.Generator) -> RegressionData:
    """Secs 6.1-6.2: theta* ~ N(0, I_d), client truths at heterogeneity Gamma, X_i i.i.d. N(0, 1),
    y_i = X_i theta_i* + sigma xi (drawn in this order: theta*, deviations, covariates, noise)."""
    theta = rng.standard_normal(d)
    stars = heterogeneous_truths(theta, len(sizes), gamma, kind, rng)
    x = [rng.standard_normal((n, d)) for n in sizes]
    truth = [xi @ t for xi, t in zip(x, stars)]
    return RegressionData(x, _noisy(truth, sigma, rng), truth, stars)


def subspace_model(sizes, d: int, r: int, sigma: float, rng: np.random.Generator) -> RegressionData:
    """Sec. 6.3: common theta* ~ N(0, I_d); client i draws E_i of r coordinates (uniform, without
    replacement) and rows x ~ N(0, (d/r) I_{E_i}), so E||x||^2 = d at every r."""
    if not 1 <= r <= d:
        raise DataError(f"data.options.rank: must be in [1, dim={d}], got {r}")
    theta = rng.standard_normal(d)
    x = []
    for n in sizes:
        coords = rng.choice(d, r, replace=False)
        xi = np.zeros((n, d))
        xi[:, coords] = math.sqrt(d / r) * rng.standard_normal((n, r))
        x.append(xi)
    truth = [xi @ theta for xi in x]
    return RegressionData(x, _noisy(truth, sigma, rng), truth, np.tile(theta, (len(sizes), 1)))


def polynomial_grid(client: int, num_clients: int, n: int, grid: str = "midpoint") -> np.ndarray:
    """Sec. 6.4: n grid points in client i's interval [-1 + 2i/M, -1 + 2(i+1)/M) (i from 0)."""
    lo, width = -1.0 + 2.0 * client / num_clients, 2.0 / num_clients
    offset = 0.5 if grid == "midpoint" else 0.0
    return lo + width * (np.arange(n) + offset) / n


def polynomial_model(sizes, sigma: float, grid: str, rng: np.random.Generator) -> RegressionData:
    """Sec. 6.4: f* = U_5 (Chebyshev, second kind) on disjoint per-client grids of [-1, 1)."""
    M = len(sizes)
    x = [polynomial_grid(i, M, n, grid)[:, None] for i, n in enumerate(sizes)]
    truth = [np.polyval(CHEBYSHEV_U5[::-1], xi[:, 0]) for xi in x]
    return RegressionData(x, _noisy(truth, sigma, rng), truth, np.tile(CHEBYSHEV_U5, (M, 1)))


def sobolev_model(sizes, sigma: float, rng: np.random.Generator) -> RegressionData:
    """The README's general kernel: f* = sin(pi x); client i's covariates uniform on [i/M, (i+1)/M]."""
    M = len(sizes)
    x = [rng.uniform(i / M, (i + 1) / M, n)[:, None] for i, n in enumerate(sizes)]
    truth = [np.sin(np.pi * xi[:, 0]) for xi in x]
    return RegressionData(x, _noisy(truth, sigma, rng), truth, None)


def client_sizes(sizes: list[int], num_clients: int) -> np.ndarray:
    """sizes[i % len(sizes)] for each client i."""
    return np.array([sizes[i % len(sizes)] for i in range(num_clients)], dtype=np.int64)


def rows_before_holdout(n: int, fraction: float) -> int:
    """The fewest rows m with m - floor(fraction * m) = n: the natural holdout then leaves n."""
    m = n
    while m - int(np.floor(fraction * np.float64(m))) < n:
        m += 1
    return m


def _params(cfg: DataConfig) -> RegressionOptions:
    options = cfg.source_options()
    assert isinstance(options, RegressionOptions)  # every source here registers RegressionOptions
    return options


def _as_source(data: RegressionData) -> Source:
    """Pooled rows with natural client ids; y = [response, truth, theta_i* (finite-rank models)] in float64."""
    x = np.concatenate(data.x).astype(np.float64)
    natural = np.repeat(np.arange(len(data.x), dtype=np.int64), data.sizes)
    columns = [np.concatenate(data.y)[:, None], np.concatenate(data.truth)[:, None]]
    if data.theta is not None:
        columns.append(data.theta[natural])
    y = np.concatenate(columns, axis=1)
    return Source(np.ascontiguousarray(x), y, x.shape[1:], 0, natural_clients=natural)


def _rows(cfg: DataConfig) -> np.ndarray:
    return np.array([rows_before_holdout(int(n), cfg.test_fraction)
                     for n in client_sizes(_params(cfg).sizes, cfg.num_clients)], dtype=np.int64)


def _rng(cfg: DataConfig, seed: int) -> np.random.Generator:
    return stream(seed, SETUP, SERVER, f"regression:{cfg.source}")


@register_source("linear_regression", natural=True, options=RegressionOptions)
def linear_regression(cfg: DataConfig, seed: int) -> Source:
    """Linear model with client model heterogeneity Gamma (Secs 6.1-6.2; Figs 1-4)."""
    p = _params(cfg)
    return _as_source(linear_model(_rows(cfg), p.dim, p.noise, p.heterogeneity, p.heterogeneity_kind, _rng(cfg, seed)))


@register_source("subspace_regression", natural=True, options=RegressionOptions)
def subspace_regression(cfg: DataConfig, seed: int) -> Source:
    """Covariate-subspace model (Sec. 6.3; Fig. 5)."""
    p = _params(cfg)
    return _as_source(subspace_model(_rows(cfg), p.dim, p.rank or p.dim, p.noise, _rng(cfg, seed)))


@register_source("polynomial_regression", natural=True, options=RegressionOptions)
def polynomial_regression(cfg: DataConfig, seed: int) -> Source:
    """Polynomial regression, U_5 on disjoint per-client grids (Sec. 6.4; Fig. 6). The holdout
    removes random grid points; the figure sweep uses exact grids of `sizes` points."""
    p = _params(cfg)
    return _as_source(polynomial_model(_rows(cfg), p.noise, p.grid, _rng(cfg, seed)))


@register_source("sobolev_regression", natural=True, options=RegressionOptions)
def sobolev_regression(cfg: DataConfig, seed: int) -> Source:
    """sin(pi x) on [0, 1] for the Sobolev-1 kernel min(x, z) (the README's general kernel)."""
    p = _params(cfg)
    return _as_source(sobolev_model(_rows(cfg), p.noise, _rng(cfg, seed)))
