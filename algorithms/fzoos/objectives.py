"""Federated black-box objectives F = sum_i w_i f_i on the unit box [0, 1]^d (the FZooS paper).

Every objective maps a batch of points u (k, d) in float64 to the clients' noiseless values;
queries add observation noise on the client side. Synthetic objectives (the quadratic of
Sec. 6.1 eq. (98)-(99), heterogeneous Ackley and Levy variants) also give true gradients, which
the gradient-quality diagnostics (Fig. 4) need.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from raysim.core.rng import SERVER, SETUP, stream


class Objective:
    """A federated objective: `local(i, u)` is client i's f_i, `value(u)` the global F = sum_i w_i f_i.

    `optimum` is F* where known (else None); `x0` the initial point; `weights` the w_i (uniform).
    """

    dim: int
    num_clients: int
    optimum: float | None = None
    x0: Tensor

    @property
    def weights(self) -> Tensor:
        return torch.full((self.num_clients,), 1.0 / self.num_clients, dtype=torch.float64)

    def local(self, i: int, u: Tensor) -> Tensor:
        """f_i at the rows of u (k, d): a (k,) tensor."""
        raise NotImplementedError

    def value(self, u: Tensor) -> float:
        """F(u) at one point (d,), as the weighted mean of the clients' values."""
        vals = torch.stack([self.local(i, u[None])[0] for i in range(self.num_clients)])
        return float(self.weights @ vals)

    def local_grad(self, i: int, u: Tensor) -> Tensor | None:
        """The true gradient of f_i at u (d,), where the objective knows it (synthetic ones)."""
        return None

    def grad(self, u: Tensor) -> Tensor | None:
        """The true gradient of F at u (d,), where known."""
        grads = [self.local_grad(i, u) for i in range(self.num_clients)]
        if grads[0] is None:
            return None
        return sum(w * g for w, g in zip(self.weights.tolist(), grads))


def dirichlet_split(rng: np.random.Generator, num_clients: int, dim: int) -> np.ndarray:
    """(N, d) weights whose columns are independent Dir(1/N * 1_N) draws, so each column sums to 1."""
    return rng.dirichlet(np.full(num_clients, 1.0 / num_clients), size=dim).T.copy()


class _BoxObjective(Objective):
    """Points u in [0, 1]^d are clipped and mapped to x = 20u - 10 in [-10, 10]^d (the code's `project`)."""

    def __init__(self, dim: int, num_clients: int, heterogeneity: float, seed: int, name: str):
        self.dim, self.num_clients, self.heterogeneity = dim, num_clients, heterogeneity
        rng = stream(seed, SETUP, SERVER, f"zo_{name}")
        n = num_clients
        self.a = torch.from_numpy(dirichlet_split(rng, n, dim))
        self.b = torch.from_numpy(dirichlet_split(rng, n, dim))
        self.x0 = torch.from_numpy(rng.uniform(0.0, 1.0, dim))

    @staticmethod
    def project(u: Tensor) -> Tensor:
        return 20.0 * u.clamp(0.0, 1.0) - 10.0

    @staticmethod
    def inside(u: Tensor) -> Tensor:
        """1 where u is inside the box (the clipped map is flat outside), else 0."""
        return ((u >= 0.0) & (u <= 1.0)).to(u.dtype)


class Quadratic(_BoxObjective):
    """Eq. (98): f_i(x) = (sum_j [(1 + C(a_ij - 1/N)) x_j^2 + (1 + C(b_ij - 1/N)) x_j] + 1) / (10 d).

    The Dirichlet weights sum to 1 over clients, so F is eq. (99) for every C, minimised at
    x_j = -0.5 (u_j = 0.475) with F* = -0.025 + 0.1/d.
    """

    def __init__(self, dim: int, num_clients: int, heterogeneity: float, seed: int):
        super().__init__(dim, num_clients, heterogeneity, seed, "quadratic")
        c, n = heterogeneity, num_clients
        self.quad = 1.0 + c * (self.a - 1.0 / n)
        self.lin = 1.0 + c * (self.b - 1.0 / n)
        self.optimum = -0.025 + 0.1 / dim

    def local(self, i: int, u: Tensor) -> Tensor:
        x = self.project(u)
        return ((x * x) @ self.quad[i] + x @ self.lin[i] + 1.0) / (10.0 * self.dim)

    def value(self, u: Tensor) -> float:
        """Eq. (99) in closed form."""
        x = self.project(u)
        return float(((x * x).sum() + x.sum() + 1.0) / (10.0 * self.dim))

    def local_grad(self, i: int, u: Tensor) -> Tensor:
        x = self.project(u)
        return 20.0 * self.inside(u) * (2.0 * self.quad[i] * x + self.lin[i]) / (10.0 * self.dim)

    def grad(self, u: Tensor) -> Tensor:
        x = self.project(u)
        return 20.0 * self.inside(u) * (2.0 * x + 1.0) / (10.0 * self.dim)


class _ScaledShifted(_BoxObjective):
    """f_i(x) = g(s_i * (x - c_i)), s_i = 0.1 + C(a_i - 1/N), c_i = C(b_i - 1/N): the code's variants."""

    def __init__(self, dim: int, num_clients: int, heterogeneity: float, seed: int, name: str):
        super().__init__(dim, num_clients, heterogeneity, seed, name)
        c, n = heterogeneity, num_clients
        self.scale = 0.1 + c * (self.a - 1.0 / n)
        self.shift = c * (self.b - 1.0 / n)

    def base(self, z: Tensor) -> Tensor:
        raise NotImplementedError

    def local(self, i: int, u: Tensor) -> Tensor:
        return self.base(self.scale[i] * (self.project(u) - self.shift[i]))

    def local_grad(self, i: int, u: Tensor) -> Tensor:
        v = u.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(self.local(i, v[None])[0], v)
        return g


class Ackley(_ScaledShifted):
    """Heterogeneous Ackley: g(z) = -20 exp(-0.2 |z| / sqrt(d)) - exp(mean cos(pi z)) + 20 + e."""

    def __init__(self, dim: int, num_clients: int, heterogeneity: float, seed: int):
        super().__init__(dim, num_clients, heterogeneity, seed, "ackley")

    def base(self, z: Tensor) -> Tensor:
        d = z.shape[-1]
        return (-20.0 * torch.exp(-0.2 / math.sqrt(d) * z.norm(dim=-1))
                - torch.exp(torch.cos(math.pi * z).mean(-1)) + 20.0 + math.e)


class Levy(_ScaledShifted):
    """Heterogeneous Levy, the standard Levy function (minimum 0 at z = 1): w = 1 + (z - 1)/4,
    g(z) = sin^2(pi w_1) + sum_{j<d} (w_j - 1)^2 (1 + 10 sin^2(pi w_j + 1)) + (w_d - 1)^2 (1 + sin^2(2 pi w_d))."""

    def __init__(self, dim: int, num_clients: int, heterogeneity: float, seed: int):
        super().__init__(dim, num_clients, heterogeneity, seed, "levy")

    def base(self, z: Tensor) -> Tensor:
        w = 1.0 + (z - 1.0) / 4.0
        head = w[..., :-1]
        return (torch.sin(math.pi * w[..., 0]) ** 2
                + ((head - 1.0) ** 2 * (1.0 + 10.0 * torch.sin(math.pi * head + 1.0) ** 2)).sum(-1)
                + (w[..., -1] - 1.0) ** 2 * (1.0 + torch.sin(2.0 * math.pi * w[..., -1]) ** 2))


SYNTHETIC = {"quadratic": Quadratic, "ackley": Ackley, "levy": Levy}
