"""The diagonal of the true Fisher (the FedFisher paper (3)), averaged over the local samples.

[F]_kk = (1/n) sum_x sum_c p_c(x) (d log p_c(x) / dW_k)^2 (eq. (3), or its Monte Carlo / empirical estimate).
Per layer the per-sample, per-output gradient is sum_t g_t a_t^T; it is squared after the sum over locations t
(Linear: (g^2)(a^2)^T). Parameters outside Linear/Conv layers join the vector with the same formula (README).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher.layers import (FisherEstimate, class_gradient_batches, fisher_partition,
                                                       split_layer_matrix)
from raysim.models import ParamSpec


def diagonal_fisher(module: nn.Module, x: torch.Tensor, batch_size: int = 64,
                    estimate: FisherEstimate = FisherEstimate(), y: torch.Tensor | None = None) -> np.ndarray:
    """diag(F) at the module's current parameters over the samples `x` (labels `y`), a flat vector in ParamSpec order."""
    layers, rest = fisher_partition(module)
    acc = [torch.zeros(l.out_dim, l.in_dim, dtype=x.dtype, device=x.device) for l in layers]
    rest_acc = [torch.zeros_like(module.get_parameter(n), dtype=x.dtype) for n in rest]
    for batch in class_gradient_batches(module, layers, x, batch_size, estimate, y, rest):
        for total, sq in zip(rest_acc, batch.rest):
            total += sq
        for total, a, g in zip(acc, batch.a, batch.g):
            if a.shape[1] == 1:
                total += torch.einsum("cbo,bi->oi", g[:, :, 0] ** 2, a[:, 0] ** 2)
            else:
                for gc in g:
                    total += (torch.einsum("bto,bti->boi", gc, a) ** 2).sum(0)
    named = {n: total / len(x) for n, total in zip(rest, rest_acc)}
    for layer, total in zip(layers, acc):
        named.update(split_layer_matrix(total / len(x), layer))
    return ParamSpec.of(module).flatten(named).cpu().numpy()
