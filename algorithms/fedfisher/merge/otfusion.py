"""OTFusion (Singh & Jaggi 2020), weight-based, as the FedFisher baseline (specs/fedfisher.md §4.4).

Client 0 is the pivot. Every other model is aligned to it layer by layer: its incoming weights are
first permuted by the previous layer's alignment, then its neurons (output channels) are matched
to the pivot's by exact OT with uniform marginals and the Euclidean ground metric on the weight
rows. With equal widths that OT plan is a permutation (Birkhoff), found by `linear_sum_assignment`,
so the `correction` flags of the reference code do not change it. The output layer keeps its
class order. The aligned models are averaged with weights p_i.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.spatial.distance import cdist

from raysim.algorithms.fedfisher.fisher.layers import Layer
from raysim.algorithms.fedfisher.merge.average import weighted_average
from raysim.models import ParamSpec


def _permute_inputs(w: torch.Tensor, perm: np.ndarray) -> torch.Tensor:
    """Reorder a weight's input channels; a Linear after a flatten sees each channel as a block of inputs."""
    block = w.shape[1] // len(perm)
    blocks = w.reshape(w.shape[0], len(perm), block, *w.shape[2:])[:, perm]
    return blocks.reshape(w.shape)


def align(model: dict[str, torch.Tensor], pivot: dict[str, torch.Tensor], layers: list[Layer]) -> dict[str, torch.Tensor]:
    """`model` with its hidden neurons permuted to match `pivot` (layers in forward order, a chain)."""
    out = dict(model)
    perm = None
    for i, layer in enumerate(layers):
        w = out[layer.weight]
        if perm is not None:
            w = _permute_inputs(w, perm)
        rows = [w.reshape(len(w), -1)] + ([out[layer.bias][:, None]] if layer.bias else [])
        ref = [pivot[layer.weight].reshape(len(w), -1)] + ([pivot[layer.bias][:, None]] if layer.bias else [])
        if i == len(layers) - 1:
            perm = np.arange(len(w))
        else:
            cost = cdist(torch.cat(ref, 1).numpy(), torch.cat(rows, 1).numpy())
            perm = linear_sum_assignment(cost)[1]
        out[layer.weight] = w[perm]
        if layer.bias:
            out[layer.bias] = out[layer.bias][perm]
    return out


def otfusion(models: np.ndarray, weights: np.ndarray, spec: ParamSpec, layers: list[Layer]) -> np.ndarray:
    """The p-weighted average of the models aligned to client 0."""
    named = [spec.unflatten(torch.as_tensor(np.asarray(m, dtype=np.float64))) for m in models]
    aligned = [spec.flatten(align(m, named[0], layers)).numpy() for m in named]
    return weighted_average(np.stack(aligned), weights)
