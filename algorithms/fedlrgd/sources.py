"""The FedLRGD paper's smooth synthetic problems, as natural-partition sources.

Every client gets `synthetic_samples // num_clients` samples (the paper's equal s per client,
before the test hold-out: with test_fraction 0.2, 25 generated give s = 20), features in
[0, 1]^p with p = `synthetic_features`, and float64 targets in [0, 1] (`num_classes` 0):

* `smooth_logistic` (App. A's loss; the README's law): x ~ U[0,1]^p, soft label y = σ(3(x_1 − x_2) + 0.5 N(0,1)),
  for the soft-label logistic loss (66) (`loss: bce`) of the bias-free `linear` model.
* `smooth_ridge` (README): u ~ U[0,1]^p, y = clip(mean(u) + 0.1 N(0,1), 0, 1), for ridge regression
  (`loss: mse` plus an ℓ2 term); its per-coordinate gradient kernel has exact rank p + 1.

`SAMPLERS` draws fresh samples from the same laws: FedLRGD's server takes its own r samples there
(the FedLRGD paper: n = m s + r; the server's data are its own, not copies of the clients').
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from raysim.algorithms.fedlrgd import nets  # noqa: F401  (registers the `linear` model these problems use)
from raysim.core.rng import SERVER, SETUP, stream
from raysim.data.config import DataConfig
from raysim.data.sources import Source, register_source
from raysim.errors import DataError


def _per_client(cfg: DataConfig) -> int:
    """Samples generated per client; enough that each keeps `partition.min_size` after the hold-out."""
    s = cfg.synthetic_samples // cfg.num_clients
    if s - math.floor(cfg.test_fraction * s) < cfg.partition.min_size:
        raise DataError(f"data.synthetic_samples: {cfg.synthetic_samples} samples over data.num_clients="
                         f"{cfg.num_clients} leave fewer than partition.min_size={cfg.partition.min_size} "
                         f"training samples per client after the test hold-out")
    return s


def logistic_draw(rng: np.random.Generator, n: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples of `smooth_logistic`: x ~ U[0,1]^p, soft labels y = σ(3(x_1 − x_2) + 0.5 N(0,1)) (float64)."""
    x = rng.uniform(0.0, 1.0, (n, p))
    return x, 1.0 / (1.0 + np.exp(-(3.0 * (x[:, 0] - x[:, 1]) + 0.5 * rng.standard_normal(n))))


def ridge_draw(rng: np.random.Generator, n: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples of `smooth_ridge`: u ~ U[0,1]^p, real targets y = clip(mean(u) + 0.1 N(0,1), 0, 1) (float64)."""
    u = rng.uniform(0.0, 1.0, (n, p))
    return u, np.clip(u.mean(1) + 0.1 * rng.standard_normal(n), 0.0, 1.0)


Sampler = Callable[[np.random.Generator, int, int], tuple[np.ndarray, np.ndarray]]
SAMPLERS: dict[str, Sampler] = {"smooth_logistic": logistic_draw, "smooth_ridge": ridge_draw}


def _natural(cfg: DataConfig, s: int) -> np.ndarray:
    return np.repeat(np.arange(cfg.num_clients, dtype=np.int64), s)


@register_source("smooth_logistic", natural=True)
def smooth_logistic(cfg: DataConfig, seed: int) -> Source:
    """`smooth_logistic`: x ~ U[0,1]^p, soft labels y = σ(3(x_1 − x_2) + 0.5 N(0,1)) (float64)."""
    p = cfg.synthetic_features
    if p < 2:
        raise DataError(f"data.synthetic_features: smooth_logistic needs p >= 2 features, got {p}")
    s = _per_client(cfg)
    x, y = logistic_draw(stream(seed, SETUP, SERVER, "smooth_logistic"), s * cfg.num_clients, p)
    return Source(x, y, (p,), 0, natural_clients=_natural(cfg, s))


@register_source("smooth_ridge", natural=True)
def smooth_ridge(cfg: DataConfig, seed: int) -> Source:
    """`smooth_ridge`: u ~ U[0,1]^p, real targets y = clip(mean(u) + 0.1 N(0,1), 0, 1) (float64)."""
    p = cfg.synthetic_features
    s = _per_client(cfg)
    u, y = ridge_draw(stream(seed, SETUP, SERVER, "smooth_ridge"), s * cfg.num_clients, p)
    return Source(u, y, (p,), 0, natural_clients=_natural(cfg, s))
