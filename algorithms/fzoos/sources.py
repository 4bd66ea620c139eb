"""Data sources of the federated zeroth-order tasks (the FZooS paper).

* `blackbox`: one placeholder row per client (natural partition). The synthetic objectives
  (quadratic, Ackley, Levy; `algorithm.objective`) are generated from the experiment seed in
  every process, so the rows only name the clients.
* `gaussian_mixture`: the stand-in for Covertype in the metric task: `synthetic_classes`
  Gaussian classes in `synthetic_features` dimensions (defaults of the task: 7 and 54).
* `covtype`: scikit-learn's Covertype, only when it is already in the local scikit-learn data
  home (never downloaded); standardised features, labels 1..7 mapped to 0..6 (the official code drops class 7).
"""
from __future__ import annotations

import numpy as np

from raysim.core.rng import SERVER, SETUP, stream
from raysim.data.config import DataConfig
from raysim.data.partition import NATURAL
from raysim.data.sources import Source, register_source
from raysim.errors import DataError

MIXTURE_SEPARATION = 0.3  # std of the class means per feature; unit-variance classes overlap (~80% accuracy)


@register_source("blackbox", natural=True)
def blackbox(cfg: DataConfig, seed: int) -> Source:
    """One row per client, client i's row naming client i; the objective lives in `algorithm.objective`."""
    if cfg.partition.kind != NATURAL:
        raise DataError(f"data.partition.kind: source 'blackbox' has one row per client and needs "
                         f"'natural', not {cfg.partition.kind!r}")
    n = cfg.num_clients
    return Source(np.zeros((n, 1), dtype=np.float32), np.zeros(n, dtype=np.int64), (1,), 1,
                  natural_clients=np.arange(n, dtype=np.int64))


@register_source("gaussian_mixture")
def gaussian_mixture(cfg: DataConfig, seed: int) -> Source:
    """`synthetic_samples` balanced samples: class means N(0, 0.3^2 I), samples N(mean, I)."""
    rng = stream(seed, SETUP, SERVER, "gaussian_mixture")
    k, d, n = cfg.synthetic_classes, cfg.synthetic_features, cfg.synthetic_samples
    means = rng.normal(0.0, MIXTURE_SEPARATION, (k, d))
    y = np.arange(n, dtype=np.int64) % k
    x = means[y] + rng.standard_normal((n, d))
    return Source(x.astype(np.float32), y, (d,), k)


@register_source("covtype")
def covtype(cfg: DataConfig, seed: int) -> Source:
    """Covertype from the local scikit-learn data home (54 features, 7 classes), standardised."""
    from sklearn.datasets import fetch_covtype

    try:
        data = fetch_covtype(download_if_missing=False)
    except OSError:
        raise DataError("data.source: 'covtype' is not in the local scikit-learn data home and is never "
                         "downloaded here; use 'gaussian_mixture' (the stand-in of the FZooS paper)") from None
    x = data.data
    x = (x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0)
    return Source(x.astype(np.float32), data.target.astype(np.int64) - 1, (x.shape[1],), 7)
