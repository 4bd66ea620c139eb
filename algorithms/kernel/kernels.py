"""Kernels for the nonparametric FedAvg/FedProx family (the kernel FedAvg/FedProx paper).

Small frozen dataclasses, float64 throughout. Every kernel has `gram(x, z)` (the raw matrix
k(x, z), no 1/n normalisation); the finite-rank ones also have `features(x)` with
k(x, z) = features(x) @ features(z).T exactly, and `dim`. Inputs are arrays of shape (n,) or
(n, p); a 1-D array is n scalar points.

* `Linear`: k(x, z) = x.z, features x (the paper's Secs 6.1-6.3).
* `Monomial(degree)`: k(x, z) = sum_{p<=degree} x^p z^p on scalars, features [1, x, ..., x^k]
  (the paper's Sec. 6.4; not gpytorch's (x.z + c)^k, which weights monomials binomially).
* `RBF(lengthscale, variance)`: variance * exp(-|x-z|^2 / (2 l^2)).
* `Matern(nu, lengthscale, variance)`, nu in {1/2, 3/2, 5/2}.
* `Sobolev1()`: min(x, z) on [0, 1] (first-order Sobolev space with f(0) = 0; the README's general kernel).
* `GPyTorch(name, ...)`: gpytorch's RBF or Matérn (times a ScaleKernel) as an optional Gram
  provider: hyperparameters set explicitly and frozen, evaluated in float64 under
  no_grad and materialised with `to_dense()`, so no approximate (CG/Lanczos) solve is involved.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def as_points(x) -> np.ndarray:
    """`x` as a float64 array of shape (n, p); a 1-D input is n scalar points; torch tensors accepted."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    return a.reshape(len(a), -1)


def sq_dists(x, z) -> np.ndarray:
    """Squared Euclidean distances between the rows of x and z, clipped at 0."""
    x, z = as_points(x), as_points(z)
    d = (x * x).sum(1)[:, None] + (z * z).sum(1)[None, :] - 2.0 * (x @ z.T)
    return np.maximum(d, 0.0)


@dataclass(frozen=True)
class Linear:
    """k(x, z) = x.z; phi(x) = x."""

    finite_rank = True

    def features(self, x) -> np.ndarray:
        return as_points(x)

    def gram(self, x, z) -> np.ndarray:
        return as_points(x) @ as_points(z).T


@dataclass(frozen=True)
class Monomial:
    """k(x, z) = sum_{p=0}^{degree} x^p z^p on scalar x; phi(x) = [1, x, ..., x^degree]."""

    degree: int = 5
    finite_rank = True

    def features(self, x) -> np.ndarray:
        a = as_points(x)
        if a.shape[1] != 1:
            raise ValueError("Monomial kernel takes scalar covariates")
        return a ** np.arange(self.degree + 1, dtype=np.float64)[None, :]

    def gram(self, x, z) -> np.ndarray:
        return self.features(x) @ self.features(z).T


@dataclass(frozen=True)
class RBF:
    """variance * exp(-|x - z|^2 / (2 lengthscale^2))."""

    lengthscale: float = 1.0
    variance: float = 1.0
    finite_rank = False

    def gram(self, x, z) -> np.ndarray:
        return self.variance * np.exp(-sq_dists(x, z) / (2.0 * self.lengthscale ** 2))


@dataclass(frozen=True)
class Matern:
    """Matérn kernel of smoothness nu in {0.5, 1.5, 2.5} (the Sobolev space of order nu + p/2)."""

    nu: float = 2.5
    lengthscale: float = 1.0
    variance: float = 1.0
    finite_rank = False

    def __post_init__(self):
        if self.nu not in (0.5, 1.5, 2.5):
            raise ValueError("Matern nu must be 0.5, 1.5 or 2.5")

    def gram(self, x, z) -> np.ndarray:
        r = np.sqrt(sq_dists(x, z)) / self.lengthscale
        if self.nu == 0.5:
            k = np.exp(-r)
        elif self.nu == 1.5:
            k = (1.0 + math.sqrt(3.0) * r) * np.exp(-math.sqrt(3.0) * r)
        else:
            k = (1.0 + math.sqrt(5.0) * r + 5.0 / 3.0 * r * r) * np.exp(-math.sqrt(5.0) * r)
        return self.variance * k


@dataclass(frozen=True)
class Sobolev1:
    """k(x, z) = min(x, z) on [0, 1]: ||f||_H^2 = int f'^2 for f(0) = 0."""

    finite_rank = False

    def gram(self, x, z) -> np.ndarray:
        x, z = as_points(x), as_points(z)
        if x.shape[1] != 1 or z.shape[1] != 1:
            raise ValueError("Sobolev1 kernel takes scalar covariates")
        return np.minimum(x[:, 0][:, None], z[:, 0][None, :])


@dataclass(frozen=True)
class GPyTorch:
    """gpytorch's `ScaleKernel(RBFKernel | MaternKernel(nu))`, exact and in float64: the same
    function as `RBF` / `Matern` with the same hyperparameters. Only plain arrays leave `gram`."""

    name: str = "rbf"
    lengthscale: float = 1.0
    variance: float = 1.0
    nu: float = 2.5
    finite_rank = False

    def __post_init__(self):
        if self.name not in ("rbf", "matern"):
            raise ValueError(f"gpytorch kernel {self.name!r}: allowed 'rbf', 'matern'")
        if self.name == "matern" and self.nu not in (0.5, 1.5, 2.5):
            raise ValueError("Matern nu must be 0.5, 1.5 or 2.5")

    def module(self):
        """The gpytorch kernel with hyperparameters set (its defaults are softplus(0), not 1) and frozen."""
        import gpytorch
        import torch

        base = gpytorch.kernels.RBFKernel() if self.name == "rbf" else gpytorch.kernels.MaternKernel(nu=self.nu)
        kernel = gpytorch.kernels.ScaleKernel(base).double()
        base.lengthscale = torch.tensor(self.lengthscale, dtype=torch.float64)  # a Python float goes through float32
        kernel.outputscale = torch.tensor(self.variance, dtype=torch.float64)
        return kernel.requires_grad_(False)

    def gram(self, x, z) -> np.ndarray:
        import torch

        with torch.no_grad():
            K = self.module()(torch.from_numpy(as_points(x)), torch.from_numpy(as_points(z))).to_dense()
        return K.numpy()


KERNELS = {"linear": Linear, "monomial": Monomial, "rbf": RBF, "matern": Matern, "sobolev": Sobolev1, "gpytorch": GPyTorch}


def make_kernel(name: str, **kw):
    """The kernel `name` (see KERNELS) with its own keyword parameters; unknown names raise."""
    if name not in KERNELS:
        raise ValueError(f"unknown kernel {name!r}; allowed: {sorted(KERNELS)}")
    return KERNELS[name](**kw)
