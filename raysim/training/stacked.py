"""Every client's minibatch gradient at once for models that are a chain of linear layers and elementwise
activations (logreg, mlp): batched matmuls over stacked parameters and one backward pass.

It issues the very kernels `vmap(grad(loss))` issues, on the same memory layouts, so the gradients are bitwise
vmap's (tests/training/test_stacked.py holds them to that for labels and soft labels, l2, dtypes and shapes), without
torch.func's per-call transforms: a local step of a few clients costs a third as much. On a CPU, cross-entropy on
class labels without l2 goes without autograd too (`StackedGrad.by_hand`: the backward's kernels called in its
order), 2.5 times faster again for 5 clients of an MLP [64]. Other models and the bce and mse losses keep vmap.
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
        return _linear(x, weight, bias)

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


def label_ce_grad(out: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """∂/∂out of Σ_i Σ_b w_ib ce(out_ib, y_ib) / max(Σ_b w_ib, 1) for logits `out` [k, B, C] and class labels `y`
    [k, B]: the kernels autograd issues for `label_cross_entropy` (raysim.training.local_sgd) on a CPU, in its order,
    so the same bits: softmax's part (exp(z − max) / Σ exp, from the forward's own exp and sum) less the weight at
    the label (the gather's backward, a scatter-add into zeros)."""
    k, b, c = out.shape
    zt = out.reshape(k * b, c).transpose(-1, -2)
    e = (zt - zt.amax(-2).unsqueeze(-2)).exp()
    per = torch.ones(k, dtype=out.dtype, device=out.device) / w.sum(1).clamp_min(1.0)
    grad = (per.unsqueeze(1).expand(k, b) * w).reshape(k * b)
    soft = (grad / e.sum(-2)).unsqueeze(-2).expand(c, k * b) * e
    label = torch.zeros(k * b, c, dtype=out.dtype, device=out.device).scatter_add_(
        -1, y.reshape(k * b).unsqueeze(-1), (-grad).unsqueeze(-1))
    return (soft.transpose(-1, -2) + label).reshape(k, b, c)


def activation_grad(layer: nn.Module, grad: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The gradient through elementwise `layer` (input x, output out): the kernel its autograd node calls."""
    aten, kind = torch.ops.aten, type(layer)
    if kind is nn.ReLU:
        return aten.threshold_backward(grad, out, 0)
    if kind is nn.Tanh:
        return aten.tanh_backward(grad, out)
    if kind is nn.Sigmoid:
        return aten.sigmoid_backward(grad, out)
    if kind is nn.GELU:
        return aten.gelu_backward(grad, x, approximate=layer.approximate)
    if kind is nn.SiLU:
        return aten.silu_backward(grad, x)
    if kind is nn.LeakyReLU:
        return aten.leaky_relu_backward(grad, x, layer.negative_slope, False)
    if kind is nn.ELU:
        return aten.elu_backward(grad, layer.alpha, 1, 1, False, x)
    if kind is nn.Softplus:
        return aten.softplus_backward(grad, x, layer.beta, layer.threshold)
    assert kind is nn.Identity, kind
    return grad


class StackedGrad:
    """∇θ_i of Σ_b w_ib·loss(f(θ_i, x_ib), y_ib) / max(Σ_b w_ib, 1) + (l2/2)‖θ_i‖² for every client i: the
    gradient `LocalSGD._loss` under vmap(grad) gives, for rows θ [k, d] and minibatches x [k, B, ...]."""

    def __init__(self, layers: list[tuple[str, nn.Module]], spec: ParamSpec,
                 losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], l2: float):
        """`losses`: cross-entropy's (`stacked_grad` makes one for no other loss); on class labels without l2 a CPU's
        gradient goes without autograd (`by_hand`, `grad_by_hand`)."""
        self.spec, self.losses, self.l2 = spec, losses, l2
        # each layer with its parameters' names, formed once rather than at every local step
        self.layers = [(layer, f"{name}.weight", f"{name}.bias") for name, layer in layers]
        # in place, an activation's autograd node takes its output where the out-of-place one takes its input
        self.by_hand = not l2 and not any(getattr(layer, "inplace", False) for _, layer in layers)

    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor,
                kept: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """The clients' outputs [k, B, out]; with `kept`, each layer's (input, output) appended to it, and its linear
        layers not autograd's Functions (`grad_by_hand`)."""
        h = x
        for layer, weight, bias in self.layers:
            x_in = h
            if type(layer) is nn.Flatten:
                h = h.reshape(h.shape[0], h.shape[1], -1)
            elif type(layer) is nn.Linear:
                h = (StackedLinear.apply if kept is None else _linear)(h, params[weight], params.get(bias))
            else:
                h = layer(h)
            if kept is not None:
                kept.append((x_in, h))
        return h

    def __call__(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                 into: torch.Tensor | None = None) -> torch.Tensor:
        if self.by_hand and theta.device.type == "cpu" and not y.is_floating_point():
            return self.grad_by_hand(theta, x, y, w, into)
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

    def grad_by_hand(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                     into: torch.Tensor | None = None) -> torch.Tensor:
        """`__call__`'s gradient under label cross-entropy without autograd: the forward keeps each layer's input and
        output, then the kernels autograd's backward would issue (StackedLinear.backward, `activation_grad`,
        `label_ce_grad`) run in its order, down to the first linear layer (the data need no gradient)."""
        params = self.spec.unflatten(theta)
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        grads: dict[str, torch.Tensor] = {}
        grad = label_ce_grad(self.forward(params, x, kept), y, w)
        first = next(i for i, (layer, _, _) in enumerate(self.layers) if type(layer) is nn.Linear)
        for i in range(len(self.layers) - 1, first - 1, -1):
            (layer, weight, bias), (x_in, out) = self.layers[i], kept[i]
            if type(layer) is nn.Linear:
                grads[weight] = torch.bmm(grad.transpose(1, 2), x_in)
                if bias in params:
                    grads[bias] = grad.sum(1)
                if i > first:
                    grad = torch.bmm(grad, params[weight])
            elif type(layer) is nn.Flatten:
                grad = grad.reshape(x_in.shape)
            else:
                grad = activation_grad(layer, grad, x_in, out)
        return self.spec.flatten(grads, into)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """b + x Wᵀ per client, as StackedLinear's forward computes it."""
    out = torch.bmm(x, weight.transpose(1, 2))
    return out if bias is None else bias[:, None, :] + out


def stacked_grad(module: nn.Module, feature_shape: tuple, spec: ParamSpec, loss: str,
                 losses: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], l2: float) -> StackedGrad | None:
    """The stacked gradient of `module` on samples of `feature_shape` under loss kind `loss`, or None where
    only vmap serves: other models, and the bce and mse losses, whose derivatives vmap batches otherwise
    (one_hot of labels runs one client at a time under vmap), so their bits would differ."""
    layers = chain_of(module, len(feature_shape))
    return None if layers is None or loss != "ce" else StackedGrad(layers, spec, losses, l2)
