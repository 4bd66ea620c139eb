"""RegMean (Jin et al. 2023) as the FedFisher code runs it (the FedFisher paper).

Per Linear layer, with client input Grams Γ_i = (1/N) Σ a a^T (a with a trailing 1 when the layer
has a bias): Γ̂_i = p_i(α Γ_i + (1 − α) diag Γ_i) and W = [(Σ Γ̂_i)^+ Σ Γ̂_i W_i^T]^T.
Every other parameter (convolutions) is averaged, unweighted as in the code or by p_i.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher.layers import Layer, curvature_layers, layer_matrix, patches, split_layer_matrix
from raysim.models import ParamSpec


def linear_layers(module: nn.Module) -> list[Layer]:
    """The Linear layers RegMean merges by regression."""
    return [l for l in curvature_layers(module) if isinstance(module.get_submodule(l.name), nn.Linear)]


def input_grams(module: nn.Module, x: torch.Tensor, batch_size: int = 16, max_batches: int = 1000) -> list[np.ndarray]:
    """Γ of every Linear layer over the first batch_size·max_batches samples (forward passes only)."""
    layers = linear_layers(module)
    mods = [module.get_submodule(l.name) for l in layers]
    grams = [torch.zeros(l.in_dim, l.in_dim, dtype=x.dtype, device=x.device) for l in layers]

    def hook(i):
        def f(m, inp, out):
            a = patches(m, inp[0]).flatten(0, 1)
            grams[i] += a.T @ a
        return f

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(mods)]
    n = min(len(x), batch_size * max_batches)
    try:
        with torch.no_grad():
            for s in range(0, n, batch_size):
                module(x[s : min(s + batch_size, n)])
    finally:
        for h in handles:
            h.remove()
    return [(g / n).cpu().numpy() for g in grams]


def regmean(models: np.ndarray, grams: list[list[np.ndarray]], weights: np.ndarray, layers: list[Layer],
            spec: ParamSpec, alpha: float, others: Literal["uniform", "samples"] = "uniform") -> np.ndarray:
    """The merged flat vector from [M, d] models and each client's Linear-layer Grams."""
    p = np.asarray(weights, dtype=np.float64)
    avg_w = np.full(len(p), 1.0 / len(p)) if others == "uniform" else p
    merged = spec.unflatten(torch.as_tensor(np.tensordot(avg_w, np.asarray(models, dtype=np.float64), axes=1)))
    named = [spec.unflatten(torch.as_tensor(np.asarray(m, dtype=np.float64))) for m in models]
    for l, layer in enumerate(layers):
        hats = [pi * (alpha * g[l] + (1 - alpha) * np.diag(np.diag(g[l]))) for pi, g in zip(p, grams)]
        rhs = sum(h @ layer_matrix(nm, layer).numpy().T for h, nm in zip(hats, named))
        w = (np.linalg.pinv(sum(hats), hermitian=True) @ rhs).T
        merged.update(split_layer_matrix(torch.as_tensor(w), layer))
    return spec.flatten(merged).numpy()
