"""A client's query history (its trajectory, the FZooS paper): append-only, float64, nearest-K windows."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class History:
    """Queried points and their observed values; the buffers grow by doubling."""

    dim: int
    n: int = 0
    X: Tensor = field(init=False)
    y: Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.X = torch.empty((16, self.dim), dtype=torch.float64)
        self.y = torch.empty(16, dtype=torch.float64)

    def add(self, X: Tensor, y: Tensor) -> None:
        """Append the rows of X (k, d) with their values y (k,)."""
        k = len(X)
        if self.n + k > len(self.X):
            size = max(2 * len(self.X), self.n + k)
            self.X = torch.cat([self.X[: self.n], torch.empty((size - self.n, self.dim), dtype=torch.float64)])
            self.y = torch.cat([self.y[: self.n], torch.empty(size - self.n, dtype=torch.float64)])
        self.X[self.n : self.n + k] = X
        self.y[self.n : self.n + k] = y
        self.n += k

    def nearest(self, x: Tensor, k: int) -> tuple[Tensor, Tensor]:
        """The (at most) k points nearest to x in Euclidean distance, with their values (the official code's windows)."""
        X, y = self.X[: self.n], self.y[: self.n]
        if self.n <= k:
            return X, y
        idx = torch.topk(((X - x) ** 2).sum(-1), k, largest=False).indices.sort().values
        return X[idx], y[idx]
