"""The per-layer quantities every Fisher approximation here is built from (specs/fedfisher.md §2.3).

For a Linear or Conv layer y = W a (+ b), the gradient of any scalar o w.r.t. W is
sum over locations of g a^T, with a the layer input (im2col patches for convolutions, a trailing 1
for the bias) and g = do/dy. One pass captures a with forward hooks and the g of K scalar outputs o_k per sample chosen so
that sum_k grad o_k grad o_k^T estimates the Fisher at that sample (`FisherEstimate`, spec §8.7).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)
FisherType = Literal["true_exact", "true_mc", "empirical"]


@dataclass(frozen=True)
class FisherEstimate:
    """Which expectation over y the Fisher takes (spec §8.7), as the K outputs o_k of each sample:
    true_exact: o_c = sqrt(p_c) log p_c for all C classes, sqrt(p_c) detached (eq. (3); nngeometry's
    `classif_logits`, the paper code's); true_mc: o_s = log p_{y_s} / sqrt(k) for k labels y_s ~ p(.|x)
    (for k >= C, equivalently and cheaper, o_c = sqrt(k_c/k) log p_c with k_c the draws of c);
    empirical: o = log p_y at the sample's own label (not eq. (3): the empirical Fisher)."""

    kind: FisherType = "true_exact"
    samples: int = 1
    generator: torch.Generator | None = None

    def outputs(self, logp: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        """[batch, K] outputs o_k from the log-probabilities [batch, C] and the labels [batch]."""
        if self.kind == "true_exact":
            return logp.exp().detach().sqrt() * logp
        if self.kind == "empirical":
            if y is None:
                raise ValueError("fisher_type 'empirical' needs the samples' labels")
            return logp.gather(1, y[:, None].to(logp.device))
        draws = torch.multinomial(logp.exp().detach().cpu(), self.samples, replacement=True,
                                  generator=self.generator).to(logp.device)
        if self.samples < logp.shape[1]:
            return logp.gather(1, draws) / self.samples ** 0.5
        counts = torch.zeros_like(logp).scatter_add_(1, draws, torch.ones_like(draws, dtype=logp.dtype))
        return (counts / self.samples).sqrt() * logp  # the same sum with K = C outputs: sqrt(share of c) log p_c


@dataclass(frozen=True)
class Layer:
    """A layer with curvature: its parameter names and the sizes of g (`out_dim`) and a (`in_dim`, bias included)."""

    name: str
    weight: str
    bias: str | None
    out_dim: int
    in_dim: int
    weight_shape: tuple[int, ...]


def curvature_layers(module: nn.Module) -> list[Layer]:
    """The Linear/Conv layers of `module` in registration order; every parameter must belong to one."""
    layers, covered = [], set()
    for name, m in module.named_modules():
        if not isinstance(m, SUPPORTED):
            continue
        if isinstance(m, (nn.Conv1d, nn.Conv2d)) and (m.groups != 1 or isinstance(m.padding, str)
                                                      or m.padding_mode != "zeros"):
            raise ValueError(f"layer {name!r}: only zero-padded, ungrouped convolutions with numeric padding are supported")
        prefix = f"{name}." if name else ""
        bias = f"{prefix}bias" if m.bias is not None else None
        w = m.weight
        layers.append(Layer(name, f"{prefix}weight", bias, w.shape[0], w[0].numel() + (bias is not None),
                            tuple(w.shape)))
        covered |= {f"{prefix}weight", *([bias] if bias else [])}
    missing = [n for n, _ in module.named_parameters() if n not in covered]
    if missing:
        raise ValueError(f"parameters {missing} are not in a Linear/Conv1d/Conv2d layer: the Fisher here (diagonal and "
                         f"K-FAC) covers only those layers and has no fallback for others (normalization layers, "
                         f"embeddings); use a model whose parameters all sit in Linear/Conv layers")
    return layers


def patches(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer input as [batch, locations, in_dim]: rows for Linear, im2col patches for convolutions."""
    if isinstance(m, nn.Linear):
        a = x.reshape(x.shape[0], -1, x.shape[-1])
    else:
        assert isinstance(m, (nn.Conv1d, nn.Conv2d)) and not isinstance(m.padding, str)  # what curvature_layers accepts
        k, d, p, s = m.kernel_size, m.dilation, m.padding, m.stride
        if isinstance(m, nn.Conv1d):  # as a 2-D convolution of height 1
            x, k, d, p, s = x.unsqueeze(2), (1, *k), (1, *d), (0, *p), (1, *s)
        a = F.unfold(x, k, dilation=d, padding=p, stride=s).transpose(1, 2)
    if m.bias is not None:
        a = torch.cat([a, a.new_ones(*a.shape[:-1], 1)], dim=-1)
    return a


def _out_grads(m: nn.Module, g: torch.Tensor) -> torch.Tensor:
    """do/dy of the K outputs [K, batch, *y.shape[1:]] as [K, batch, locations, out_dim]."""
    if isinstance(m, nn.Linear):
        return g.reshape(g.shape[0], g.shape[1], -1, g.shape[-1])
    return g.flatten(3).transpose(2, 3)


@dataclass
class BatchStats:
    """One batch: per layer the inputs a [B, T, in_dim] and the output gradients g [K, B, T, out_dim] of the K outputs o_k."""

    a: list[torch.Tensor]
    g: list[torch.Tensor]


def class_gradient_batches(module: nn.Module, layers: list[Layer], x: torch.Tensor, batch_size: int,
                           estimate: FisherEstimate = FisherEstimate(),
                           y: torch.Tensor | None = None) -> Iterator[BatchStats]:
    """For each batch of `x` (labels `y`): one forward pass, then the K backward passes of the estimate's
    outputs o_k (batched with `is_grads_batched`), returning the layer inputs and output gradients."""
    mods = [module.get_submodule(l.name) if l.name else module for l in layers]
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}

    def hook(i):
        def f(m, inp, out):
            inputs[i], outputs[i] = inp[0].detach(), out
        return f

    handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(mods)]
    try:
        for s in range(0, len(x), batch_size):
            logits = module(x[s : s + batch_size])
            o = estimate.outputs(F.log_softmax(logits, dim=1), None if y is None else y[s : s + batch_size])
            c = o.shape[1]
            eye = torch.eye(c, dtype=o.dtype, device=o.device)[:, None, :].expand(c, *o.shape)
            outs = [outputs[i] for i in range(len(mods))]
            gs = torch.autograd.grad(o, outs, grad_outputs=eye, is_grads_batched=True)
            yield BatchStats([patches(m, inputs[i]) for i, m in enumerate(mods)],
                             [_out_grads(m, g) for m, g in zip(mods, gs)])
    finally:
        for h in handles:
            h.remove()


def layer_matrix(named: dict[str, torch.Tensor], layer: Layer) -> torch.Tensor:
    """The layer's parameters as one [out_dim, in_dim] matrix: the flattened weight, then the bias column."""
    w = named[layer.weight].reshape(layer.out_dim, -1)
    return torch.cat([w, named[layer.bias][:, None]], dim=1) if layer.bias else w


def split_layer_matrix(mat: torch.Tensor, layer: Layer) -> dict[str, torch.Tensor]:
    """Inverse of `layer_matrix`: {parameter name: tensor of the parameter's shape}."""
    n_w = layer.in_dim - (layer.bias is not None)
    out = {layer.weight: mat[:, :n_w].reshape(layer.weight_shape)}
    if layer.bias:
        out[layer.bias] = mat[:, n_w]
    return out
