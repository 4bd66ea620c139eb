"""K-FAC (KFC for convolutions) factors of the true Fisher (the FedFisher paper).

Per Linear/Conv layer: A = sqrt(C)/n sum_x sum_t a_t a_t^T and
G = 1/(sqrt(C) n) sum_x sum_c (1/|T|) sum_t g_{c,t} g_{c,t}^T, so the layer's Fisher block is
G ⊗ A in row-major vec order and its product with a layer-shaped V is G V A (nngeometry PMatKFAC).
With a Monte Carlo or empirical estimate of eq. (3) the sum over c runs over its K outputs and sqrt(C) is sqrt(K);
the sqrt factors cancel in G ⊗ A. Parameters outside Linear/Conv layers get the diagonal true Fisher instead
(not in the paper; README), as `diagonal_fisher` computes it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher.layers import FisherEstimate, Layer, class_gradient_batches, fisher_partition


@dataclass
class KFACBlock:
    """One layer's factors: A (in_dim x in_dim, input side) and G (out_dim x out_dim, output side)."""

    layer: Layer
    A: np.ndarray
    G: np.ndarray


@dataclass
class KFAC:
    """A block-diagonal Fisher with one Kronecker-factored block per layer and, for the parameters outside those
    layers, a diagonal block: {name: diag(F) in the parameter's shape}."""

    blocks: list[KFACBlock]
    diagonal: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def floats(self) -> int:
        """Numbers uploaded: sum over layers of dim(A)^2 + dim(G)^2 (App. C), plus the diagonal's."""
        return sum(b.A.size + b.G.size for b in self.blocks) + sum(v.size for v in self.diagonal.values())

    @property
    def nbytes(self) -> int:
        return sum(b.A.nbytes + b.G.nbytes for b in self.blocks) + sum(v.nbytes for v in self.diagonal.values())


def kfac_fisher(module: nn.Module, x: torch.Tensor, batch_size: int = 64, estimate: FisherEstimate = FisherEstimate(),
                y: torch.Tensor | None = None) -> KFAC:
    """The K-FAC factors at the module's current parameters over the samples `x` (labels `y`)."""
    layers, rest = fisher_partition(module)
    a_acc = [torch.zeros(l.in_dim, l.in_dim, dtype=x.dtype, device=x.device) for l in layers]
    g_acc = [torch.zeros(l.out_dim, l.out_dim, dtype=x.dtype, device=x.device) for l in layers]
    rest_acc = [torch.zeros_like(module.get_parameter(n), dtype=x.dtype) for n in rest]
    classes: int | None = None
    for batch in class_gradient_batches(module, layers, x, batch_size, estimate, y, rest):
        for total, sq in zip(rest_acc, batch.rest):
            total += sq
        for a_tot, g_tot, a, g in zip(a_acc, g_acc, batch.a, batch.g):
            classes = g.shape[0]
            a_tot += torch.einsum("bti,btj->ij", a, a)
            g_tot += torch.einsum("cbto,cbtp->op", g, g) / g.shape[2]
    n = len(x)
    diagonal = {name: (total / n).cpu().numpy() for name, total in zip(rest, rest_acc)}
    if not layers:
        return KFAC([], diagonal)
    assert classes is not None, "no batch of gradients (empty x)"
    root_c = math.sqrt(classes)
    return KFAC([KFACBlock(l, (a * root_c / n).cpu().numpy(), (g / (root_c * n)).cpu().numpy())
                 for l, a, g in zip(layers, a_acc, g_acc)], diagonal)
