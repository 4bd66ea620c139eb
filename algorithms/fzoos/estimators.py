"""The finite-difference gradient estimator of eq. (3) (the FZooS paper).

Delta(x) = scale * sum_q (y(x + lambda u_q) - y(x)) / lambda * u_q with Gaussian directions
(the paper) or Gram-Schmidt-orthonormalised unit directions (the official code). It is unbiased
for the gradient of the smoothed f when scale * E[u u'] = I / Q: scale 1/Q for Gaussian
directions (E[u u'] = I), d/Q for unit ones (E[u u'] = I / d). The code's 1/Q with unit
directions estimates grad f / d.
"""
from __future__ import annotations

from typing import Callable, Literal

import numpy as np
import torch
from torch import Tensor

Kind = Literal["gaussian", "orthonormal"]
Scale = Literal["inv_q", "d_over_q"]


def directions(dim: int, num: int, kind: Kind, rng: np.random.Generator) -> Tensor:
    """Q directions (Q, d): i.i.d. N(0, I), or those orthonormalised to unit length (Q <= d)."""
    U = torch.from_numpy(rng.standard_normal((num, dim)))
    if kind == "gaussian":
        return U
    q, r = torch.linalg.qr(U.T)
    return (q * torch.sign(torch.diagonal(r))).T


def unbiased_scale(kind: Kind) -> Scale:
    """The scale that makes eq. (3) unbiased for the smoothed gradient with directions of `kind`."""
    return "inv_q" if kind == "gaussian" else "d_over_q"


def fd_gradient(query: Callable[[Tensor], Tensor], x: Tensor, fx: Tensor, U: Tensor, smoothing: float,
                scale: Scale) -> Tensor:
    """Eq. (3) at x given y(x) = fx; `query` evaluates the rows of x + lambda U (Q queries)."""
    diffs = (query(x + smoothing * U) - fx) / smoothing
    factor = (U.shape[1] if scale == "d_over_q" else 1.0) / len(U)
    return factor * (diffs @ U)
