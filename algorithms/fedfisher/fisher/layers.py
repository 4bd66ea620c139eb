"""The per-layer quantities every Fisher approximation here is built from (the FedFisher paper).

For a Linear or Conv layer y = W a (+ b), the gradient of any scalar o w.r.t. W is
sum over locations of g a^T, with a the layer input (im2col patches for convolutions, a trailing 1
for the bias) and g = do/dy. One pass captures a with forward hooks and the g of K scalar outputs o_k per sample chosen so
that sum_k grad o_k grad o_k^T estimates the Fisher at that sample (`FisherEstimate`; eq. (3) is exact).
Every other parameter (normalization layers, embeddings, free parameters) gets the README's diagonal fallback:
sum_k (d o_k / d theta)^2 per sample, from per-sample gradients (torch.func). The module is in eval mode throughout,
so BatchNorm uses its running statistics and each sample's gradient is its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, jacrev, vmap

SUPPORTED = (nn.Linear, nn.Conv1d, nn.Conv2d)
FisherType = Literal["true_exact", "true_mc", "empirical"]


@dataclass(frozen=True)
class FisherEstimate:
    """Which expectation over y the Fisher takes (eq. (3): the model's own), as the K outputs o_k of each sample:
    true_exact: o_c = sqrt(p_c) log p_c for all C classes, sqrt(p_c) detached (eq. (3); nngeometry's
    `classif_logits`, the paper code's); true_mc: o_s = log p_{y_s} / sqrt(k) for k labels y_s ~ p(.|x)
    (for k >= C, equivalently and cheaper, o_c = sqrt(k_c/k) log p_c with k_c the draws of c);
    empirical: o = log p_y at the sample's own label (not eq. (3): the empirical Fisher)."""

    kind: FisherType = "true_exact"
    samples: int = 1
    generator: torch.Generator | None = None

    def weights(self, p: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        """[batch, K, C] coefficients w with o_k = sum_c w_kc log p_c, from the probabilities p [batch, C] and the
        labels [batch] (true_mc draws its labels here, once per batch)."""
        if self.kind == "true_exact":
            return torch.diag_embed(p.sqrt())
        if self.kind == "empirical":
            if y is None:
                raise ValueError("fisher_type 'empirical' needs the samples' labels")
            return F.one_hot(y.to(p.device), p.shape[1]).to(p.dtype)[:, None, :]
        draws = torch.multinomial(p.cpu(), self.samples, replacement=True, generator=self.generator).to(p.device)
        if self.samples < p.shape[1]:
            return F.one_hot(draws, p.shape[1]).to(p.dtype) / self.samples ** 0.5
        counts = torch.zeros_like(p).scatter_add_(1, draws, torch.ones_like(draws, dtype=p.dtype))
        return torch.diag_embed((counts / self.samples).sqrt())  # K = C outputs: sqrt(share of c) log p_c


def outputs_of(w: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """o_k = sum_c w_kc log p_c per sample: [batch, K] from w [batch, K, C] and logp [batch, C]."""
    return torch.einsum("bkc,bc->bk", w, logp)


@dataclass(frozen=True)
class Layer:
    """A layer with curvature: its parameter names and the sizes of g (`out_dim`) and a (`in_dim`, bias included)."""

    name: str
    weight: str
    bias: str | None
    out_dim: int
    in_dim: int
    weight_shape: tuple[int, ...]


def fisher_partition(module: nn.Module) -> tuple[list[Layer], list[str]]:
    """The Linear/Conv layers of `module` in registration order, and the names of the parameters outside them
    (they get the README's diagonal fallback)."""
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
    return layers, [n for n, _ in module.named_parameters() if n not in covered]


def curvature_layers(module: nn.Module) -> list[Layer]:
    """The Linear/Conv layers of `module`, for the methods that work layer by layer; every parameter must belong to one."""
    layers, rest = fisher_partition(module)
    if rest:
        raise ValueError(f"parameters {rest} are not in a Linear/Conv1d/Conv2d layer: this method works layer by layer "
                         f"on those layers only (FedFisher and FisherMerge give other parameters a diagonal Fisher); "
                         f"use a model whose parameters all sit in Linear/Conv layers")
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
    """One batch: per layer the inputs a [B, T, in_dim] and the output gradients g [K, B, T, out_dim] of the K outputs
    o_k; per parameter outside the layers, sum_b sum_k (d o_k(x_b) / d theta)^2 in the parameter's shape."""

    a: list[torch.Tensor]
    g: list[torch.Tensor]
    rest: list[torch.Tensor]


def class_gradient_batches(module: nn.Module, layers: list[Layer], x: torch.Tensor, batch_size: int,
                           estimate: FisherEstimate = FisherEstimate(), y: torch.Tensor | None = None,
                           rest: Sequence[str] = ()) -> Iterator[BatchStats]:
    """For each batch of `x` (labels `y`), in eval mode: one forward pass, then the K backward passes of the
    estimate's outputs o_k (batched with `is_grads_batched`), returning the layer inputs and output gradients, and
    the summed squared per-sample gradients of the parameters named in `rest`."""
    mods = [module.get_submodule(l.name) if l.name else module for l in layers]
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}

    def hook(i):
        def f(m, inp, out):
            inputs[i], outputs[i] = inp[0].detach(), out
        return f

    training = module.training
    module.eval()
    try:
        for s in range(0, len(x), batch_size):
            xb = x[s : s + batch_size]
            handles = [m.register_forward_hook(hook(i)) for i, m in enumerate(mods)]
            try:
                logp = F.log_softmax(module(xb), dim=1)
            finally:
                for h in handles:
                    h.remove()
            w = estimate.weights(logp.exp().detach(), None if y is None else y[s : s + batch_size])
            o = outputs_of(w, logp)
            c = o.shape[1]
            eye = torch.eye(c, dtype=o.dtype, device=o.device)[:, None, :].expand(c, *o.shape)
            outs = [outputs[i] for i in range(len(mods))]
            gs = torch.autograd.grad(o, outs, grad_outputs=eye, is_grads_batched=True) if outs else ()
            yield BatchStats([patches(m, inputs[i]) for i, m in enumerate(mods)],
                             [_out_grads(m, g) for m, g in zip(mods, gs)],
                             per_sample_squares(module, list(rest), xb, w) if rest else [])
    finally:
        module.train(training)


def per_sample_squares(module: nn.Module, names: list[str], x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """sum_b sum_k (d o_k(x_b) / d theta)^2 for each parameter theta named in `names`, with o_k(x_b) = sum_c w_bkc
    log p_c(x_b): per-sample gradients as a vmap over samples of the Jacobian (the module runs on one sample at a time)."""
    state = {**{n: t.detach() for n, t in module.named_parameters()}, **dict(module.named_buffers())}

    def sample_outputs(theta: dict[str, torch.Tensor], xb: torch.Tensor, wb: torch.Tensor) -> torch.Tensor:
        logits = functional_call(module, {**state, **theta}, (xb[None],))
        return outputs_of(wb[None], F.log_softmax(logits, dim=1))[0]

    def squares(xb: torch.Tensor, wb: torch.Tensor) -> dict[str, torch.Tensor]:
        jac = jacrev(sample_outputs)({n: state[n] for n in names}, xb, wb)
        return {n: (j**2).sum(0) for n, j in jac.items()}

    per = vmap(squares)(x, w)
    return [per[n].sum(0) for n in names]


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
