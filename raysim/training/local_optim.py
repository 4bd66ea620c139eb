"""The clients' local optimizer, vectorized over a shard's clients: SGD (with momentum and weight decay) or Adam,
with torch.optim's update rules (SGD: dampening 0, no Nesterov; Adam: L2 weight decay, bias-corrected), fresh
at every round's local training (the state does not cross rounds).

Clients may run different numbers of steps in one vectorized loop: a padded step (`active` 0) leaves a client's
parameters and optimizer state untouched. Plain SGD keeps the fused `addcmul_` step, so its numbers are bitwise
those of the loop before optimizers existed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field


class LocalOptimizer(BaseModel):
    """`local_optimizer:` of the torch-model families; `lr` stays the algorithm's (its schedule too)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sgd", "adam"] = "sgd"
    momentum: float = Field(0.0, ge=0, lt=1, description="sgd: heavy-ball momentum (torch.optim.SGD's)")
    weight_decay: float = Field(0.0, ge=0, description="L2 term added to the gradient, as torch.optim's weight_decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="adam: beta1, beta2")
    eps: float = Field(1e-8, gt=0, description="adam: epsilon")

    @property
    def plain(self) -> bool:
        """Plain SGD: nothing but θ ← θ − η g."""
        return self.kind == "sgd" and self.momentum == 0 and self.weight_decay == 0

    def start(self, theta: torch.Tensor) -> "LocalOptState":
        """A fresh state for the stacked parameters `theta` [k, d]."""
        first = torch.zeros_like(theta) if self.kind == "adam" or self.momentum > 0 else None
        second = torch.zeros_like(theta) if self.kind == "adam" else None
        return LocalOptState(self, first, second, torch.zeros((theta.shape[0], 1), dtype=theta.dtype, device=theta.device))


@dataclass
class LocalOptState:
    """Per-client moments (rows of [k, d]) and step counts [k, 1]."""

    opt: LocalOptimizer
    m: torch.Tensor | None
    v: torch.Tensor | None
    t: torch.Tensor

    def step(self, theta: torch.Tensor, g: torch.Tensor, lr: float, active: torch.Tensor) -> None:
        """One local step of every client, in place on `theta` [k, d]; `active` [k, 1] is 1 for a real step."""
        o = self.opt
        if o.plain:
            theta.addcmul_(active, g, value=-lr)
            return
        on = active > 0
        if o.weight_decay:
            g = g + o.weight_decay * theta
        if o.kind == "sgd":
            if self.m is not None:
                self.m = torch.where(on, o.momentum * self.m + g, self.m)
                g = self.m
            theta.addcmul_(active, g, value=-lr)
            return
        b1, b2 = o.betas
        assert self.m is not None and self.v is not None  # start() makes both moments for adam
        self.t = self.t + active
        self.m = torch.where(on, b1 * self.m + (1 - b1) * g, self.m)
        self.v = torch.where(on, b2 * self.v + (1 - b2) * g * g, self.v)
        t = self.t.clamp_min(1.0)
        denom = (self.v.sqrt() / (1 - b2 ** t).sqrt()) + o.eps
        theta.addcdiv_(active * (lr / (1 - b1 ** t)) * self.m, denom, value=-1.0)
