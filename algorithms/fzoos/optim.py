"""The local optimiser fed with estimated gradients: Adam (lr 0.01, optax/torch defaults, state reset
every round; the FZooS paper) or plain gradient descent (the theory), then clipping to [0, 1]^d."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class LocalOptimizer:
    """One round's optimiser state; build a fresh one at the start of every round."""

    kind: str
    lr: float
    clip: bool
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: Tensor | None = None
    v: Tensor | None = None

    def step(self, x: Tensor, g: Tensor) -> Tensor:
        """x - lr * Adam(g) (bias-corrected, eps outside the root) or x - lr * g; clipped when asked."""
        if self.kind == "adam":
            self.t += 1
            self.m = (1 - self.beta1) * g if self.m is None else self.beta1 * self.m + (1 - self.beta1) * g
            self.v = (1 - self.beta2) * g * g if self.v is None else self.beta2 * self.v + (1 - self.beta2) * g * g
            m_hat = self.m / (1 - self.beta1**self.t)
            v_hat = self.v / (1 - self.beta2**self.t)
            x = x - self.lr * m_hat / (torch.sqrt(v_hat) + self.eps)
        else:
            x = x - self.lr * g
        return x.clamp(0.0, 1.0) if self.clip else x
