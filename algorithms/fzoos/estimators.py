"""The finite-difference gradient estimator of eq. (3) (specs/fzoos.md §3.1).

Delta(x) = scale * sum_q (y(x + lambda u_q) - y(x)) / lambda * u_q with Gaussian directions
(the paper, unbiased for the smoothed f with scale 1/Q) or Gram-Schmidt-orthonormalised unit
directions (the official code; scale d/Q makes it unbiased, 1/Q is the code's).
"""
from __future__ import annotations

from typing import Callable, Literal

import numpy as np
import torch
from torch import Tensor


def directions(dim: int, num: int, kind: Literal["gaussian", "orthonormal"], rng: np.random.Generator) -> Tensor:
    """Q directions (Q, d): i.i.d. N(0, I), or those orthonormalised to unit length (Q <= d)."""
    U = torch.from_numpy(rng.standard_normal((num, dim)))
    if kind == "gaussian":
        return U
    q, r = torch.linalg.qr(U.T)
    return (q * torch.sign(torch.diagonal(r))).T


def fd_gradient(query: Callable[[Tensor], Tensor], x: Tensor, fx: Tensor, U: Tensor, smoothing: float,
                scale: Literal["inv_q", "d_over_q"]) -> Tensor:
    """Eq. (3) at x given y(x) = fx; `query` evaluates the rows of x + lambda U (Q queries)."""
    diffs = (query(x + smoothing * U) - fx) / smoothing
    factor = (U.shape[1] if scale == "d_over_q" else 1.0) / len(U)
    return factor * (diffs @ U)
