"""The server's upload queue (the FedLRGD paper): completion offsets of the uploads.

Sizes are per-client uploads in model-sized vectors (fractional allowed, 0 = no upload). Offsets
are measured from the start of the communication phase, in the input order; size-0 clients get 0.
Each synchronous round's queue starts empty: the server has served every kept upload of round t before it
broadcasts round t+1, so no backlog can carry over. Under the buffered and async schedules one queue carries
its backlog from arrival to arrival (`CarriedQueue`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _uploaders(sizes: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The sizes as floats and the indices of the uploading clients in uniformly random order."""
    s = np.asarray(sizes, dtype=float)
    if np.any(s < 0):
        raise ValueError("upload sizes must be >= 0")
    return s, rng.permutation(np.flatnonzero(s > 0))


def _fifo_departures(arrivals: np.ndarray, service: np.ndarray) -> np.ndarray:
    """Departures of a FIFO single server from empty (Lindley: D_i = max(A_i, D_{i-1}) + S_i)."""
    done = np.cumsum(service)
    return done + np.maximum.accumulate(arrivals - (done - service))


def burke_completions(sizes: np.ndarray, phi: float, rng: np.random.Generator) -> np.ndarray:
    """Burke-mode completions (22)-(24): partial sums of phi*Gamma(size_c, 1) in random order.

    For k unit uploads the drain time is phi*Erlang(k, 1): mean phi*k, variance phi^2*k.
    """
    s, order = _uploaders(sizes, rng)
    out = np.zeros_like(s)
    out[order] = phi * np.cumsum(rng.gamma(s[order], 1.0))
    return out


def explicit_completions(
    sizes: np.ndarray, phi: float, nu: float, rng: np.random.Generator
) -> np.ndarray:
    """Explicit FIFO M/M/1 from empty (the FedLRGD paper's Sec. II-D2 queue): Poisson(1) arrivals in random
    client order, service Gamma(size_c, 1/nu), departures by the Lindley recursion, all scaled by phi."""
    s, order = _uploaders(sizes, rng)
    arrivals = np.cumsum(rng.exponential(1.0, order.size))
    out = np.zeros_like(s)
    out[order] = phi * _fifo_departures(arrivals, rng.gamma(s[order], 1.0 / nu))
    return out


def mm1_sojourn_times(n: int, nu: float, rng: np.random.Generator) -> np.ndarray:
    """Sojourn times (wait + service) of the first n customers of an M/M/1 queue (rate 1, nu)
    from empty; in steady state they are Exp(nu - 1), mean 1/(nu - 1) (Sec. II-D2)."""
    arrivals = np.cumsum(rng.exponential(1.0, n))
    return _fifo_departures(arrivals, rng.exponential(1.0 / nu, n)) - arrivals


@dataclass
class CarriedQueue:
    """The server's upload queue in continuous simulated time (the buffered and async schedules): one FIFO server
    whose backlog carries from one arrival to the next, D = max(A, D_prev) + S (Lindley). With Poisson(lambda)
    arrivals and Exp(nu) services its mean sojourn is 1/(nu - lambda) in steady state (M/M/1)."""

    free_at: float = 0.0

    def depart(self, arrival: float, service: float) -> float:
        """The departure of an upload reaching the queue at `arrival` (after every earlier one) needing `service`."""
        self.free_at = max(arrival, self.free_at) + service
        return self.free_at
