"""Staleness functions: the weight of an update applied s server versions after its model was sent."""
from __future__ import annotations

import math

from raysim.schedule.config import StalenessConfig


def staleness_weight(s: int, cfg: StalenessConfig) -> float:
    """The weight of an update of staleness `s` >= 0: 1 (`constant`), (1+s)^-a (`polynomial`) or 1 for s <= b else
    1/(a(s-b)+1) (`hinge`) as in FedAsync (Xie et al., 2019), 1/sqrt(1+s) (`fedbuff`, Nguyen et al., 2022). Exactly 1.0
    at s = 0 for each, so a fresh update is applied unscaled."""
    if s < 0:
        raise ValueError(f"staleness must be >= 0, got {s}")
    if cfg.kind == "constant" or s == 0:
        return 1.0
    if cfg.kind == "polynomial":
        return float((1.0 + s) ** -cfg.a)
    if cfg.kind == "hinge":
        return 1.0 if s <= cfg.b else 1.0 / (cfg.a * (s - cfg.b) + 1.0)
    return 1.0 / math.sqrt(1.0 + s)
