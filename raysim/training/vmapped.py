"""Every client's minibatch gradient for models that are not a chain of linear layers (convolutions and the like):
a forward pass vmapped over the clients' stacked parameters and one backward pass (`torch.autograd.grad`: the bits
`vmap(grad(loss))` gives, without torch.func's gradient transform, whose first call imports torch._dynamo, 1.2 s).

The clients go through in calls of a fixed number of them (`vmap_width`), the last call padded. A vmapped
convolution is a grouped one, one group a client, and its kernels, so its bits, change with the number of groups:
at a fixed width a client's gradient is the same whichever clients share its shard, and however many.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.func import vmap

from raysim.models import ParamSpec

CPU_WIDTH = 16  # clients a call on a CPU: LeNet-sized clients run as fast as at any width, 8x8-digit CNNs 1.1x the best
DEVICE_WIDTH = 256  # clients a call on an accelerator, where a call's launches, not its arithmetic, set the pace


def vmap_width(device: torch.device) -> int:
    """The clients every vmapped call takes on `device`."""
    return CPU_WIDTH if device.type == "cpu" else DEVICE_WIDTH


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
    """∇ of `loss(params, x, y, w)` (one client's named parameters and minibatch) for every client of stacked rows
    θ [k, d] at once, as rows [k, d], in `vmap_width(device)` clients a call."""

    def __init__(self, loss: Callable[..., torch.Tensor], spec: ParamSpec, device: torch.device):
        self.loss, self.spec, self.width = loss, spec, vmap_width(device)
        self._losses = vmap(loss)

    def _call(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """One call's gradients: the parameters leaves of their own, so the backward writes each one's gradient
        once (not summed into views of the whole row, a full-row add per tensor)."""
        with torch.enable_grad():
            params = {n: p.detach().requires_grad_() for n, p in self.spec.unflatten(theta).items()}
            grads = torch.autograd.grad(self._losses(params, x, y, w).sum(), list(params.values()))
        return self.spec.flatten(dict(zip(params, grads)))

    def __call__(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                 out: torch.Tensor | None = None) -> torch.Tensor:
        """The clients' gradients [k, d], written into `out` when given."""
        g = in_fixed_calls(self._call, self.width, theta, x, y, w)
        return g if out is None else out.copy_(g)
