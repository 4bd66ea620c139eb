"""Every client's minibatch gradient at once for models that are a chain of linear layers and elementwise
activations (logreg, mlp): batched matmuls over stacked parameters and one backward pass.

It issues the very kernels `vmap(grad(loss))` issues, on the same memory layouts, so the gradients are bitwise
vmap's (tests/training/test_stacked.py holds them to that for labels and soft labels, l2, dtypes and shapes), without
torch.func's per-call transforms: a local step of a few clients costs a third as much. Other models and the
bce and mse losses keep vmap.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from raysim.models import ParamSpec

ELEMENTWISE = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.LeakyReLU, nn.ELU, nn.Softplus, nn.Identity)


class StackedLinear(torch.autograd.Function):
    """x [k, B, in] -> b + x Wᵀ per client. The backward takes ∂W as (∂out)ᵀ x, the product `mm`'s
    derivative forms for a column-major Wᵀ, which is what vmap's `linear` differentiates. (forward takes
    ctx itself: a separate setup_context makes every call bind the signature, 20 µs a layer a step.)"""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        out = torch.bmm(x, weight.transpose(1, 2))
        return out if bias is None else bias[:, None, :] + out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_x = torch.bmm(grad, weight) if ctx.needs_input_grad[0] else None
        return grad_x, torch.bmm(grad.transpose(1, 2), x), grad.sum(1) if ctx.has_bias else None


def chain_of(module: nn.Module, feature_dims: int) -> list[tuple[str, nn.Module]] | None:
    """The layers of `module` if it is an nn.Sequential of Flatten (all but the sample dim), Linear and
    elementwise activations whose every Linear sees one feature dimension; None otherwise."""
    if type(module) is not nn.Sequential:  # exact types: a subclass may have its own forward
        return None
    layers, flat = [], feature_dims == 1
    for name, layer in module.named_children():
        if type(layer) is nn.Flatten and layer.start_dim == 1 and layer.end_dim == -1:
            flat = True
        elif type(layer) is nn.Linear and flat:
            pass
        elif type(layer) not in ELEMENTWISE:
            return None
        layers.append((name, layer))
    return layers if any(type(layer) is nn.Linear for _, layer in layers) else None


class StackedGrad:
    """∇θ_i of Σ_b w_ib·loss(f(θ_i, x_ib), y_ib) / max(Σ_b w_ib, 1) + (l2/2)‖θ_i‖² for every client i: the
    gradient `LocalSGD._loss` under vmap(grad) gives, for rows θ [k, d] and minibatches x [k, B, ...]."""

    def __init__(self, layers: list[tuple[str, nn.Module]], spec: ParamSpec,
                 losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], l2: float):
        self.spec, self.losses, self.l2 = spec, losses, l2
        # each layer with its parameters' names, formed once rather than at every local step
        self.layers = [(layer, f"{name}.weight", f"{name}.bias") for name, layer in layers]

    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """The clients' outputs [k, B, out]."""
        h = x
        for layer, weight, bias in self.layers:
            if type(layer) is nn.Flatten:
                h = h.reshape(h.shape[0], h.shape[1], -1)
            elif type(layer) is nn.Linear:
                h = StackedLinear.apply(h, params[weight], params.get(bias))
            else:
                h = layer(h)
        return h

    def __call__(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        k, b = w.shape
        with torch.enable_grad():
            params = {n: p.detach().requires_grad_(True) for n, p in self.spec.unflatten(theta).items()}
            out = self.forward(params, x)
            losses = self.losses(out.reshape(k * b, *out.shape[2:]), y.reshape(k * b, *y.shape[2:])).reshape(k, b)
            per = (w * losses).sum(1) / w.sum(1).clamp_min(1.0)
            if self.l2:  # the expression of squared_norm, per client
                per = per + 0.5 * self.l2 * sum((p * p).reshape(k, -1).sum(1) for p in params.values())
            grads = torch.autograd.grad(per.sum(), list(params.values()))
        return self.spec.flatten(dict(zip(params, grads)), into)


def stacked_grad(module: nn.Module, feature_shape: tuple, spec: ParamSpec, loss: str,
                 losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], l2: float) -> StackedGrad | None:
    """The stacked gradient of `module` on samples of `feature_shape` under loss kind `loss`, or None where
    only vmap serves: other models, and the bce and mse losses, whose derivatives vmap batches otherwise
    (one_hot of labels runs one client at a time under vmap), so their bits would differ."""
    layers = chain_of(module, len(feature_shape))
    return None if layers is None or loss != "ce" else StackedGrad(layers, spec, losses, l2)
