"""Random-Fourier-feature compression of a GP mean (the FZooS paper (6)-(7)).

phi(x) = sqrt(2/M) cos(V x + b), V ~ N(0, I / l^2), b ~ U[0, 2 pi], drawn once from the experiment
seed so every client and the server share them (only the seed travels). A client uploads the
weights w = Phi' (Phi Phi' + sigma^2 I)^-1 y (dual form, de-normalised); the gradient of a
surrogate is grad phi(x)' w = -sqrt(2/M) V' (w * sin(V x + b)), linear in w, so the mean of the
clients' weights is the surrogate of F.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from raysim.algorithms.fzoos.gp import normalise
from raysim.core.rng import SERVER, SETUP, stream


@dataclass(frozen=True)
class RandomFeatures:
    """The shared features: frequencies V (M, d) and phases b (M,), float64."""

    V: Tensor
    b: Tensor

    @property
    def num(self) -> int:
        return len(self.b)


@lru_cache(maxsize=4)
def shared_features(seed: int, num: int, dim: int, lengthscale: float) -> RandomFeatures:
    """The features of the SE kernel with length scale l, from the stream (seed, setup, server, "rff")."""
    rng = stream(seed, SETUP, SERVER, "rff")
    V = torch.from_numpy(rng.standard_normal((num, dim))) / lengthscale
    b = torch.from_numpy(rng.uniform(0.0, 2.0 * math.pi, num))
    return RandomFeatures(V, b)


def features(rf: RandomFeatures, X: Tensor) -> Tensor:
    """Phi (n, M): the features of the rows of X."""
    return math.sqrt(2.0 / rf.num) * torch.cos(X @ rf.V.T + rf.b)


def fit_weights(rf: RandomFeatures, X: Tensor, y: Tensor, noise: float) -> Tensor:
    """Eq. (6) on min-max-normalised targets, de-normalised by their range (as the official code does): w (M,)."""
    yn, span = normalise(y)
    Phi = features(rf, X)
    K = Phi @ Phi.T
    K.diagonal().add_(noise)
    L, info = torch.linalg.cholesky_ex(K)
    if int(info):
        L = torch.linalg.cholesky(K + 1e-10 * torch.eye(len(K), dtype=K.dtype))
    return span * (Phi.T @ torch.cholesky_solve(yn[:, None], L)[:, 0])


def surrogate_grad(rf: RandomFeatures, w: Tensor, x: Tensor) -> Tensor:
    """grad phi(x)' w = -sqrt(2/M) V' (w * sin(V x + b)) (d,)."""
    return -math.sqrt(2.0 / rf.num) * (rf.V.T @ (w * torch.sin(rf.V @ x + rf.b)))
