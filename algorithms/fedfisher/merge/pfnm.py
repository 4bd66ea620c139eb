"""PFNM (Yurochkin et al. 2019) as the FedFisher baseline (the FedFisher paper): the one-shot,
layer-by-layer neuron matching of the FedMA code (`oneshot_matching`), with BBP-MAP per layer.

Model (PFNM §3): global atoms θ_i ~ N(μ0, σ0 I); client j's neuron l is θ_i + N(0, σ I) for the atom it
picks; which atoms a client picks follows the Beta-Bernoulli process (Indian buffet, mass γ). As in the
reference code σ and σ0 are variances (precisions p = 1/σ, p0 = 1/σ0), μ0 = 0 for weights and 0.1 for
the bias. An atom is kept in natural parameters: G_i = p0 μ0 + p Σ w (the sum over its neurons) and
S_i = p0 + p m_i with m_i its neuron count; its MAP value is G_i / S_i (Prop. 1).

Layers are matched from the input up. Hidden layer k: every client's neuron (the flattened in-weights of
a unit or conv filter, then its bias; a bias-free model gets zero biases, as in FedFisher's code) is
written in the global input space of layer k-1 (its input channels scattered to the global indices its
previous layer was matched to, zeros elsewhere), then BBP-MAP assigns neurons to atoms: clients are
matched one at a time against the atoms of the others (`match_client`, one Hungarian problem), first in
order, then `iterations` sweeps in random order. The output layer is not matched: its rows are the
classes, averaged with class-count weights n_jc / Σ_j n_jc. The global model can be wider than the local
ones; `widen` builds it from the local architecture.

Two deliberate differences from the reference code: μ0 = 0.1 sits on the bias coordinate in every layer
(the code puts it on the first in-weight of every layer after the first), and the counts m_i in the
popularity term are not capped at 10 (the cap only binds with more than 11 clients).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import nn

from raysim.algorithms.fedfisher.fisher.layers import Layer, curvature_layers
from raysim.models import ParamSpec

BIAS_PRIOR_MEAN = 0.1  # μ0 of the bias coordinate (the reference code's mu0_bias)


@dataclass(frozen=True)
class PFNMPrior:
    """The hyperparameters of the BBP model and of its MAP search (reference defaults)."""

    sigma: float = 1.0  # variance of a local neuron around its atom
    sigma0: float = 1.0  # prior variance of an atom around μ0
    gamma: float = 7.0  # mass of the Beta-Bernoulli process
    iterations: int = 5  # random-order sweeps after the first pass
    max_global_width: int = 700  # new atoms offered: max(this - L, 1) (the code's 700), or enough to place all


@dataclass
class Atoms:
    """The global atoms of one layer in natural parameters: G [L, D], S [L] and the counts m [L]."""

    G: np.ndarray
    S: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:
        return len(self.counts)


def _prior_mean(dim: int) -> np.ndarray:
    """μ0 of a neuron of `dim` coordinates whose last coordinate is the bias."""
    mu = np.zeros(dim)
    mu[-1] = BIAS_PRIOR_MEAN
    return mu


def assignment_gains(w: np.ndarray, atoms: Atoms, prior: PFNMPrior, num_clients: int) -> np.ndarray:
    """The matrix -C^j of PFNM §3.1 for client j's neurons w [L_j, D] against the other clients' atoms:
    column i < L is atom i, column L + t (t = 0, 1, ...) the (t+1)-th new atom. Hungarian on it maximizes
    the MAP objective of B^j given the rest (the posterior of the atoms under Prop. 1 plus the BBP prior):

      -C_il         = |G_i + p w_l|^2 / (S_i + p) - |G_i|^2 / S_i + log(m_i / (J - m_i))
      -C_{i=L+t, l} = |p0 μ0 + p w_l|^2 / (p0 + p) - |p0 μ0|^2 / p0 + 2 log(γ / J) - 2 log(t + 1)

    The popularity term has weight 1, not the paper's 2, as in the reference code that FedFisher ran.
    The -2 log(t+1) terms add up to -2 log k! for k new atoms (their Poisson(γ/J) prior)."""
    p, p0 = 1.0 / prior.sigma, 1.0 / prior.sigma0
    L, Lj = len(atoms), len(w)
    inv = 1.0 / (atoms.S + p)
    sq = (w * w).sum(1)
    matched = (p * p * sq[:, None] + 2 * p * w @ atoms.G.T + (atoms.G * atoms.G).sum(1)[None]) * inv[None]
    matched -= ((atoms.G * atoms.G).sum(1) / atoms.S)[None]
    matched += np.log(atoms.counts / (num_clients - atoms.counts))[None]
    n_new = min(Lj, max(prior.max_global_width - L, Lj - L, 1))
    g0 = p0 * _prior_mean(w.shape[1])
    new = ((g0[None] + p * w) ** 2).sum(1) / (p0 + p) - (g0 * g0).sum() / p0 + 2 * math.log(prior.gamma / num_clients)
    new = new[:, None] - 2 * np.log(np.arange(1, n_new + 1))[None]
    return np.hstack([matched, new])


def match_client(w: np.ndarray, atoms: Atoms, prior: PFNMPrior, num_clients: int) -> tuple[Atoms, np.ndarray]:
    """Assign client j's neurons w [L_j, D] to the atoms of the others or to new atoms (one Hungarian
    problem on `assignment_gains`), and add them to the atoms. Returns the atoms and each neuron's atom."""
    p, p0 = 1.0 / prior.sigma, 1.0 / prior.sigma0
    L = len(atoms)
    rows, cols = linear_sum_assignment(assignment_gains(w, atoms, prior, num_clients), maximize=True)
    assign = np.empty(len(w), dtype=np.int64)
    old = cols < L
    assign[rows[old]] = cols[old]
    fresh = rows[~old]  # new atoms appended in the order of the client's neurons
    assign[fresh] = L + np.arange(len(fresh))
    G = np.vstack([atoms.G, np.broadcast_to(p0 * _prior_mean(w.shape[1]), (len(fresh), w.shape[1]))])
    S = np.concatenate([atoms.S, np.full(len(fresh), p0)])
    counts = np.concatenate([atoms.counts, np.zeros(len(fresh), dtype=np.int64)])
    G[assign] += p * w
    S[assign] += p
    counts[assign] += 1
    return Atoms(G, S, counts), assign


def _remove_client(atoms: Atoms, w: np.ndarray, assign: list[np.ndarray], j: int,
                   p: float) -> tuple[Atoms, list[np.ndarray]]:
    """The atoms without client j's neurons w; atoms left empty are deleted and the other clients'
    assignments remapped (client j's own is left stale, to be replaced by `match_client`)."""
    G, S, counts = atoms.G.copy(), atoms.S.copy(), atoms.counts.copy()
    a = assign[j]
    G[a] -= p * w
    S[a] -= p
    counts[a] -= 1
    keep = counts > 0
    remap = np.cumsum(keep) - 1
    assign = [a if o == j else remap[a] for o, a in enumerate(assign)]
    return Atoms(G[keep], S[keep], counts[keep]), assign


def match_layer(neurons: list[np.ndarray], prior: PFNMPrior,
                rng: np.random.Generator) -> tuple[np.ndarray, list[np.ndarray]]:
    """BBP-MAP for one layer (the reference `match_layer`): neurons[j] is client j's [L_j, D]. Clients are
    added in order of decreasing width, then `iterations` sweeps remove and re-match each client in a
    random order. Returns the MAP atoms G/S [L, D] (Prop. 1) and each client's assignment."""
    J = len(neurons)
    p, p0 = 1.0 / prior.sigma, 1.0 / prior.sigma0
    order = sorted(range(J), key=lambda j: -len(neurons[j]))
    first = neurons[order[0]]
    atoms = Atoms(p0 * _prior_mean(first.shape[1])[None] + p * first, np.full(len(first), p0 + p),
                  np.ones(len(first), dtype=np.int64))
    assign: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * J
    assign[order[0]] = np.arange(len(first))
    for j in order[1:]:
        atoms, assign[j] = match_client(neurons[j], atoms, prior, J)
    for _ in range(prior.iterations):
        for j in rng.permutation(J):
            atoms, assign = _remove_client(atoms, neurons[j], assign, j, p)
            atoms, assign[j] = match_client(neurons[j], atoms, prior, J)
    return atoms.G / atoms.S[:, None], assign


def class_weights(class_counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """a_jc = n_jc / Σ_j n_jc (FedMA's last-layer averaging weights); p_j for a class no client holds."""
    counts = np.asarray(class_counts, dtype=np.float64)
    total = counts.sum(0)
    a = np.where(total > 0, counts / np.where(total > 0, total, 1.0), np.asarray(weights, dtype=np.float64)[:, None])
    return a


def _scatter_inputs(w: np.ndarray, assign: np.ndarray | None, width: int) -> np.ndarray:
    """A layer's weight [out, in_channels, block] with its input channels put at their global indices
    (zeros elsewhere), flattened to [out, width * block]; unchanged for the first layer."""
    if assign is None:
        return w.reshape(len(w), -1)
    out = np.zeros((w.shape[0], width, w.shape[2]))
    out[:, assign] = w
    return out.reshape(len(w), -1)


def _block(layer: Layer, prev: Layer) -> int:
    """How many inputs of `layer` each output channel of `prev` feeds (kernel size, or spatial size after a flatten)."""
    per_out = math.prod(layer.weight_shape[1:])
    if per_out % prev.out_dim:
        raise ValueError(f"PFNM needs a chain of Linear/Conv layers: {layer.name!r} has {per_out} inputs per unit, "
                         f"not a multiple of the {prev.out_dim} channels of {prev.name!r}")
    return per_out // prev.out_dim


def _bias_name(layer: Layer) -> str:
    return layer.weight[: -len("weight")] + "bias"


def widen(template: nn.Module, widths: tuple[int, ...]) -> nn.Module:
    """A copy of `template` whose Linear/Conv layers (a chain, in registration order) have the hidden
    widths `widths` (one per layer but the last) and biases; activations, pooling, flatten are kept."""
    layers = curvature_layers(template)
    if len(widths) != len(layers) - 1:
        raise ValueError(f"widths: need {len(layers) - 1} hidden widths for this model, got {len(widths)}")
    module = copy.deepcopy(template)
    for k, layer in enumerate(layers):
        old = module.get_submodule(layer.name)
        out = widths[k] if k < len(widths) else layer.out_dim
        assert isinstance(old, (nn.Linear, nn.Conv1d, nn.Conv2d))  # curvature_layers accepts no other
        kw: dict[str, Any] = {"bias": True, "dtype": old.weight.dtype, "device": old.weight.device}
        new: nn.Module
        if isinstance(old, nn.Linear):
            inp = old.in_features if k == 0 else widths[k - 1] * _block(layer, layers[k - 1])
            new = nn.Linear(inp, out, **kw)
        else:
            inp = old.in_channels if k == 0 else widths[k - 1]
            # torch types a layer's own kernel_size, stride, ... as tuple[int, ...]; its constructor wants fixed lengths
            new = type(old)(inp, out, old.kernel_size, stride=old.stride, padding=old.padding,  # type: ignore[arg-type]
                            dilation=old.dilation, padding_mode=old.padding_mode, **kw)  # type: ignore[arg-type]
        parent, _, name = layer.name.rpartition(".")
        setattr(module.get_submodule(parent), name, new)
    return module


def pfnm(models: np.ndarray, class_counts: np.ndarray, weights: np.ndarray, template: nn.Module,
         prior: PFNMPrior, rng: np.random.Generator) -> tuple[np.ndarray, tuple[int, ...]]:
    """The PFNM global model of the local flat models [J, d] of `template`: its flat parameters (for
    `widen(template, widths)`, float64) and its hidden widths. class_counts [J, C] gives the output layer's
    averaging weights; `weights` (p_j) only stands in for classes no client holds."""
    spec, layers = ParamSpec.of(template), curvature_layers(template)
    named = [{k: v.numpy() for k, v in spec.unflatten(torch.as_tensor(np.asarray(m, dtype=np.float64))).items()}
             for m in models]
    J = len(named)
    out: dict[str, torch.Tensor] = {}
    widths: list[int] = []
    assign: Sequence[np.ndarray | None] = [None] * J
    for k, layer in enumerate(layers):
        block = 1 if k == 0 else _block(layer, layers[k - 1])
        rows = []
        for j, m in enumerate(named):
            w = m[layer.weight].reshape(layer.out_dim, -1 if k == 0 else layers[k - 1].out_dim, block)
            b = m[layer.bias] if layer.bias else np.zeros(layer.out_dim)
            rows.append(np.hstack([_scatter_inputs(w, assign[j], widths[-1] if k else 0), b[:, None]]))
        if k < len(layers) - 1:
            merged, assign = match_layer(rows, prior, rng)
            widths.append(len(merged))
        else:
            a = class_weights(class_counts, weights)
            merged = np.einsum("jc,jcd->cd", a, np.stack(rows))
        kernel = layer.weight_shape[2:]
        shape = (len(merged), (merged.shape[1] - 1) // math.prod(kernel), *kernel)
        out[layer.weight] = torch.as_tensor(merged[:, :-1]).reshape(shape)
        out[_bias_name(layer)] = torch.as_tensor(merged[:, -1])
    wide = widen(template, tuple(widths))
    return ParamSpec.of(wide).flatten(out).numpy(), tuple(widths)
