"""Rényi-DP accounting of DP-FedAvg (McMahan et al., 2018) with dp-accounting: each round a Gaussian mechanism of
noise multiplier z on k clients drawn without replacement from n (replace-one neighbours, the relation that
sampling is defined for), composed over the rounds; and the z that spends a target ε over a run."""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=64)
def round_rdp(n: int, k: int, z: float) -> tuple[np.ndarray, np.ndarray]:
    """(orders, the RDP of one round at each order): composition adds it up round by round."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, k, dp_accounting.GaussianDpEvent(z)), 1)
    # the accountant's own curve, read once: ε after t rounds is then compute_epsilon(orders, t x rdp), a
    # millisecond, where a new accountant each round would take a fifth of a second
    return np.asarray(accountant._orders, dtype=np.float64), np.asarray(accountant._rdp, dtype=np.float64)


def epsilon_after(n: int, k: int, z: float, rounds: int, delta: float) -> float:
    """ε at `delta` after `rounds` rounds of noise multiplier z on k of n clients; inf without noise."""
    if z == 0:
        return math.inf
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    orders, rdp = round_rdp(n, k, z)
    return float(compute_epsilon(orders, rounds * rdp, delta)[0])


@lru_cache(maxsize=64)
def calibrated_noise(n: int, k: int, rounds: int, target_epsilon: float, delta: float) -> float:
    """The least noise multiplier z (to 0.1%) whose ε after `rounds` rounds is at most `target_epsilon`."""
    def eps(z: float) -> float:
        return epsilon_after(n, k, z, rounds, delta)

    lo, hi = 0.0, 1.0
    while eps(hi) > target_epsilon:
        lo, hi = hi, 2 * hi
        if hi > 1e4:
            raise ValueError(f"no noise multiplier up to 1e4 spends at most ε={target_epsilon:g} over {rounds} rounds"
                             f" of {k} of {n} clients at δ={delta:g}")
    while hi - lo > 1e-3 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eps(mid) > target_epsilon else (lo, mid)
    return hi
