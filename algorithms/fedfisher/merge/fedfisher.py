"""The FedFisher server problem (the FedFisher paper eq. (6)-(7), App. D.3) and its solvers.

Φ(W) = ½ Σ_i p_i (W − W_i)^T F_i (W − W_i), ∇Φ(W) = (Σ_i p_i F_i) W − b with b = Σ_i p_i F_i W_i.
The minimum-distance part of (7) is implicit: the solver starts at W̄ = Σ p_i W_i and stops
early (Lemma 1); the best iterate on a validation score every `every` steps is returned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal, cast

import numpy as np
import torch

from raysim.algorithms.fedfisher.fisher import KFAC, layer_matrix, split_layer_matrix
from raysim.models import ParamSpec

OptimizerKind = Literal["fedfisher_adam", "adam", "gd"]


class DiagObjective:
    """Φ for diagonal Fishers: only the three sums Σ p_i F_i, Σ p_i F_i W_i, Σ p_i W_i F_i W_i are kept."""

    eps_inside_sqrt = False  # the code's Diag update: w -= lr m / (sqrt(v) + eps)

    def __init__(self, models: np.ndarray, fishers: np.ndarray, weights: np.ndarray, dtype=torch.float32):
        p = np.asarray(weights, dtype=np.float64)[:, None]
        models, fishers = np.asarray(models, dtype=np.float64), np.asarray(fishers, dtype=np.float64)
        self.dtype = dtype
        self.f_sum = torch.as_tensor((p * fishers).sum(0), dtype=dtype)
        self.b = torch.as_tensor((p * fishers * models).sum(0), dtype=dtype)
        self.const = 0.5 * float((p * fishers * models**2).sum())

    def grad(self, w: torch.Tensor) -> torch.Tensor:
        return self.f_sum * w - self.b

    def value(self, w: torch.Tensor) -> float:
        return float(0.5 * (self.f_sum * w * w).sum() - (self.b * w).sum()) + self.const


class KFACObjective:
    """Φ for K-FAC Fishers: per layer Σ_i p_i G_i W A_i − B with B = Σ_i p_i G_i W_i A_i (eq. (6), K-FAC), plus the
    diagonal blocks of the parameters outside the layers (README) as a `DiagObjective` that is zero on the layers."""

    eps_inside_sqrt = True  # the code's K-FAC update: w -= lr m / sqrt(v + eps)

    def __init__(self, models: np.ndarray, fishers: list[KFAC], weights: np.ndarray, spec: ParamSpec,
                 dtype=torch.float32):
        self.spec, self.dtype = spec, dtype
        self.layers = [b.layer for b in fishers[0].blocks]
        t = lambda a: torch.as_tensor(a, dtype=dtype)  # noqa: E731
        self.p = [float(x) for x in weights]
        self.A = [[t(f.blocks[l].A) for f in fishers] for l in range(len(self.layers))]
        self.G = [[t(f.blocks[l].G) for f in fishers] for l in range(len(self.layers))]
        self.models = [t(m) for m in models]
        self.B = [sum(p * g @ self._mat(w, l) @ a for p, g, a, w in zip(self.p, self.G[l], self.A[l], self.models))
                  for l in range(len(self.layers))]
        self.diagonal = DiagObjective(models, np.stack([self._diagonal_vector(f) for f in fishers]), weights, dtype)

    def _diagonal_vector(self, f: KFAC) -> np.ndarray:
        """f's diagonal block as a flat vector in ParamSpec order, 0 on the K-FAC layers' parameters."""
        named = {n: torch.as_tensor(f.diagonal[n], dtype=torch.float64) if n in f.diagonal
                 else torch.zeros(shape, dtype=torch.float64) for n, shape in zip(self.spec.names, self.spec.shapes)}
        return self.spec.flatten(named).numpy()

    def _mat(self, w: torch.Tensor, l: int) -> torch.Tensor:
        return layer_matrix(self.spec.unflatten(w), self.layers[l])

    def _fmv(self, w: torch.Tensor, l: int) -> torch.Tensor:
        """Σ_i p_i G_i W_l A_i for the layer-l matrix of w."""
        v = self._mat(w, l)
        return cast(torch.Tensor, sum(p * g @ v @ a for p, g, a in zip(self.p, self.G[l], self.A[l])))  # never empty: not sum's start 0

    def grad(self, w: torch.Tensor) -> torch.Tensor:
        named = self.spec.unflatten(self.diagonal.grad(w))
        for l, layer in enumerate(self.layers):
            named.update(split_layer_matrix(self._fmv(w, l) - self.B[l], layer))
        return self.spec.flatten(named)

    def value(self, w: torch.Tensor) -> float:
        total = self.diagonal.value(w)
        for l in range(len(self.layers)):
            for p, g, a, wi in zip(self.p, self.G[l], self.A[l], self.models):
                v = self._mat(w - wi, l)
                total += 0.5 * p * float((v * (g @ v @ a)).sum())
        return total


class DenseObjective:
    """Φ for full d x d Fishers (FedFisher(Full), the theory of Sec. 3; small d only)."""

    eps_inside_sqrt = False

    def __init__(self, models: np.ndarray, fishers: np.ndarray, weights: np.ndarray, dtype=torch.float64):
        p = np.asarray(weights, dtype=np.float64)
        self.dtype = dtype
        f_sum = np.einsum("i,ijk->jk", p, fishers)
        self.f_sum = torch.as_tensor(f_sum, dtype=dtype)
        self.b = torch.as_tensor(np.einsum("i,ijk,ik->j", p, fishers, models), dtype=dtype)

    def grad(self, w: torch.Tensor) -> torch.Tensor:
        return self.f_sum @ w - self.b


@dataclass
class ServerOptimizer:
    """The server's update rule (App. D.3's Adam, as the paper's code implements it).

    fedfisher_adam: the code's Adam without bias correction or (1 − β) factors, ε outside the sqrt
    for Diag and inside it for K-FAC; adam: torch.optim.Adam's rule; gd: w ← w − lr ∇Φ.
    """

    kind: OptimizerKind = "fedfisher_adam"
    lr: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 0.01


@dataclass
class SolveResult:
    """The returned iterate, the step it was taken after, and the validation scores by step."""

    w: np.ndarray
    best_step: int
    scores: dict[int, float] = field(default_factory=dict)


def solve(objective: DiagObjective | KFACObjective | DenseObjective, w0: np.ndarray, steps: int, opt: ServerOptimizer,
          score: Callable[[np.ndarray], float] | None = None, every: int = 100) -> SolveResult:
    """Run `steps` updates from w0; with `score`, evaluate after steps k ≡ 0 (mod every) and return the
    best (ties: the earliest), else the last iterate (App. D.3's model selection)."""
    w = torch.as_tensor(w0, dtype=objective.dtype).clone()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    b1, b2 = opt.betas
    best, best_w, best_step, scores = -np.inf, w.clone(), steps - 1, {}
    for k in range(steps):
        g = objective.grad(w)
        if opt.kind == "gd":
            w = w - opt.lr * g
        elif opt.kind == "fedfisher_adam":
            m = g + b1 * m
            v = g * g + b2 * v
            denom = (v + opt.eps).sqrt() if objective.eps_inside_sqrt else v.sqrt() + opt.eps
            w = w - opt.lr * m / denom
        else:
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            w = w - opt.lr * (m / (1 - b1 ** (k + 1))) / ((v / (1 - b2 ** (k + 1))).sqrt() + opt.eps)
        if score is not None and k % every == 0:
            s = scores[k] = float(score(w.numpy()))
            if s > best:
                best, best_w, best_step = s, w.clone(), k
    if score is None:
        best_w = w
    return SolveResult(best_w.numpy().astype(np.float64), best_step, scores)


def min_norm_solution(f_sum: np.ndarray, b: np.ndarray, w_bar: np.ndarray, rcond: float = 1e-10) -> np.ndarray:
    """W* = W̄ + F⁺(b − F W̄): the point of {F W = b} nearest W̄ (eq. (7), dense F; for tests and theory)."""
    return w_bar + np.linalg.pinv(f_sum, rcond=rcond, hermitian=True) @ (b - f_sum @ w_bar)
