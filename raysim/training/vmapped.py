"""Every client's minibatch gradient for models that are not a chain of linear layers (convolutions and the like):
a forward pass vmapped over the clients' stacked parameters and one backward pass (`torch.autograd.grad`: the bits
`vmap(grad(loss))` gives, without torch.func's gradient transform, whose first call imports torch._dynamo, 1.2 s).

The clients go through in calls of a fixed number of them (`vmap_width`), the last call padded; at width 1 (a model
of 7 million multiply-adds a client-step or more) one at a time, not vmapped. A vmapped convolution is a grouped
one, one group a client, and its kernels, so its bits, change with the number of groups: at a fixed width a client's
gradient is the same whichever clients share its shard, and however many.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.func import vmap

from raysim.models import ParamSpec

CPU_CALL_MACS = 10_000_000  # a CPU call's forward multiply-adds: at least what its vmap and autograd bookkeeping costs
CPU_MAX_WIDTH = 64  # a tiny model's calls: past this the bookkeeping saved is a few percent
DEVICE_WIDTH = 256  # clients a call on an accelerator, where a call's launches, not its arithmetic, set the pace


def sample_macs(module: nn.Module, feature_shape: tuple, dtype: torch.dtype) -> int:
    """Multiply-adds of one sample's forward pass: a convolution's or linear layer's outputs times the inputs each
    sums, any other leaf module's outputs (one forward in eval mode: a function of the architecture only)."""
    total = 0

    def count(mod: nn.Module, _: tuple, out: object) -> None:
        nonlocal total
        if not isinstance(out, torch.Tensor):
            return
        if isinstance(mod, nn.modules.conv._ConvNd):
            total += out.numel() * mod.in_channels // mod.groups * math.prod(mod.kernel_size)
        elif isinstance(mod, nn.Linear):
            total += out.numel() * mod.in_features
        elif not any(True for _ in mod.children()):
            total += out.numel()

    device = next(module.parameters()).device
    handles = [m.register_forward_hook(count) for m in module.modules()]
    modes = [(m, m.training) for m in module.modules()]  # each its own: a model may hold frozen parts in eval mode
    try:
        module.eval()
        with torch.no_grad():
            module(torch.zeros((1, *feature_shape), dtype=dtype, device=device))
    finally:
        for m, mode in modes:
            m.training = mode
        for h in handles:
            h.remove()
    return total


def vmap_width(device: torch.device, client_macs: int, clients_per_round: int) -> int:
    """The clients every vmapped call takes: on a CPU about as many as make CPU_CALL_MACS (a power of two, 1 to
    CPU_MAX_WIDTH), so that a shard of many clients runs within about 1.4x of one call of them all, and a shard of
    few pays its padding (for a tiny CNN a lone client costs up to 6x, `benchmarks/vmapped.py`); DEVICE_WIDTH on an
    accelerator; never more than a round's clients."""
    if device.type == "cpu":
        width = min(CPU_MAX_WIDTH, 2 ** round(math.log2(max(CPU_CALL_MACS / max(client_macs, 1), 1.0))))
    else:
        width = DEVICE_WIDTH
    return max(1, min(width, clients_per_round))


def in_fixed_calls(fn: Callable[..., torch.Tensor], width: int, *tensors: torch.Tensor) -> torch.Tensor:
    """fn of `tensors` (clients along their leading axis) in calls of exactly `width` clients, the last call padded
    with copies of its last client; the results concatenated, the padding's dropped."""
    k = len(tensors[0])
    parts = []
    for a in range(0, k, width):
        chunk = [t[a:a + width] for t in tensors]
        short = width - len(chunk[0])
        if short:
            chunk = [torch.cat([c, c[-1:].expand(short, *c.shape[1:])]) for c in chunk]
        parts.append(fn(*chunk)[:width - short])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class VmappedGrad:
    """∇ of `loss(params, x, y, w)` (one client's named parameters and minibatch of `batch_width` rows) for every
    client of stacked rows θ [k, d] at once, as rows [k, d], `width` clients a call (`vmap_width` of the module's
    multiply-adds a client-step)."""

    def __init__(self, loss: Callable[..., torch.Tensor], module: nn.Module, spec: ParamSpec, feature_shape: tuple,
                 dtype: torch.dtype, device: torch.device, batch_width: int, clients_per_round: int):
        self.loss, self.spec = loss, spec
        macs = sample_macs(module, tuple(feature_shape), dtype) if device.type == "cpu" else 0
        self.width = vmap_width(device, macs * batch_width, clients_per_round)  # counted here, never by two threads
        self._losses = vmap(loss)

    def _grads(self, loss: Callable[..., torch.Tensor], theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
               w: torch.Tensor) -> torch.Tensor:
        """∇ of the summed `loss` at θ (one client's row [d], or one call's rows [width, d]): the parameters leaves of
        their own, so the backward writes each one's gradient once (not summed into views of the whole row)."""
        with torch.enable_grad():
            params = {n: p.detach().requires_grad_() for n, p in self.spec.unflatten(theta).items()}
            grads = torch.autograd.grad(loss(params, x, y, w).sum(), list(params.values()))
        return self.spec.flatten(dict(zip(params, grads)))

    def _call(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """One vmapped call's gradients [width, d]."""
        return self._grads(self._losses, theta, x, y, w)

    def __call__(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """The clients' gradients [k, d], written into `out` when given."""
        if self.width == 1:  # one client at a time, not vmapped: a vmapped call's bookkeeping would be a fifth of it
            out = torch.empty_like(theta) if out is None else out
            for i in range(len(theta)):
                out[i] = self._grads(self.loss, theta[i], x[i], y[i], w[i])
            return out
        g = in_fixed_calls(self._call, self.width, theta, x, y, w)
        return g if out is None else out.copy_(g)
