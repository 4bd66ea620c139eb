"""OTFusion (Singh & Jaggi 2020), weight-based, as the FedFisher baseline runs it (the FedFisher paper).

Client 0 is the pivot; every other model is aligned to it layer by layer, the output layer included
(`skip_last_layer False`), as in the paper's `algs/otfusion.py`:
  aligned_l = W_l T_{l-1} (its inputs moved by the previous map; aligned_0 = W_0),
  T_l = EMD(uniform, uniform, ‖aligned_l[i] − pivot_l[j]‖²)   (a permutation / n_l for equal widths),
  T_l ← T_l diag(1 / (1/n_l + 1e-7))                         if `correction`,
  fused_l = T_lᵀ aligned_l if `past_correction` else T_lᵀ W_l,
and the merge is p_0 W_pivot + Σ_{i>0} p_i fused_i. Without `correction` T_l keeps its 1/n_l mass, which
shrinks the fused layers and changes the next layer's matching; so from a common initialization, where
every T_l is a permutation, only (correction, past_correction) = (True, True) is close to FedAvg.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from raysim.algorithms.fedfisher.fisher.layers import Layer
from raysim.models import ParamSpec

EPS = 1e-7  # the reference's `eps` in the marginal correction
FLAGS = ((True, True), (True, False), (False, True), (False, False))  # the code's tuning order (ties: first)


def transport(cost: np.ndarray) -> np.ndarray:
    """Exact OT plan between two uniform measures of equal size n: a permutation matrix / n (Birkhoff)."""
    n = len(cost)
    rows, cols = linear_sum_assignment(cost)
    plan = np.zeros_like(cost)
    plan[rows, cols] = 1.0 / n
    return plan


def _move_inputs(w: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """W T on the input channels; a Linear after a flatten sees each channel as a block of inputs."""
    blocks = w.reshape(w.shape[0], t.shape[0], -1)
    return torch.einsum("oik,ij->ojk", blocks, t).reshape(w.shape)


def fuse(model: dict[str, torch.Tensor], pivot: dict[str, torch.Tensor], layers: list[Layer],
         correction: bool, past_correction: bool) -> dict[str, torch.Tensor]:
    """`model` transported onto `pivot`'s neurons (layers in forward order, a chain), with the code's flags."""
    out = dict(model)
    t = None
    for layer in layers:
        w = model[layer.weight]
        aligned = w if t is None else _move_inputs(w, t)
        rows = [aligned.reshape(len(w), -1)] + ([model[layer.bias][:, None]] if layer.bias else [])
        ref = [pivot[layer.weight].reshape(len(w), -1)] + ([pivot[layer.bias][:, None]] if layer.bias else [])
        cost = torch.cdist(torch.cat(rows, 1), torch.cat(ref, 1)) ** 2
        t = torch.as_tensor(transport(cost.numpy()), dtype=w.dtype)
        if correction:
            t = t / (1.0 / len(t) + EPS)
        source = aligned if past_correction else w
        out[layer.weight] = (t.T @ source.reshape(len(w), -1)).reshape(w.shape)
        if layer.bias:
            out[layer.bias] = t.T @ model[layer.bias]
    return out


def otfusion(models: np.ndarray, weights: np.ndarray, spec: ParamSpec, layers: list[Layer],
             correction: bool, past_correction: bool) -> np.ndarray:
    """p_0 W_0 + Σ_{i>0} p_i fuse(W_i, W_0): the code's `one_shot_otfusion` with pivot 0."""
    named = [spec.unflatten(torch.as_tensor(np.asarray(m, dtype=np.float64))) for m in models]
    merged = weights[0] * np.asarray(models[0], dtype=np.float64)
    for p, m in zip(weights[1:], named[1:]):
        merged = merged + p * spec.flatten(fuse(m, named[0], layers, correction, past_correction)).numpy()
    return merged


def flag_grid(models: np.ndarray, weights: np.ndarray, spec: ParamSpec,
              layers: list[Layer]) -> Iterator[np.ndarray]:
    """The merges for the code's (correction, past_correction) grid, in its tuning order `FLAGS`."""
    for correction, past in FLAGS:
        yield otfusion(models, weights, spec, layers, correction, past)
