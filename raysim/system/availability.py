"""Which clients are online when (the `system.availability` section): always, Bernoulli at each selection, on/off
Markov periods, a diurnal cycle, or a trace of intervals. Every draw is counter-based and keyed by (seed, client,
switch or round, purpose), so a client's availability does not depend on who asks, when, or on which process."""
from __future__ import annotations

import numpy as np

from raysim.core.keys import uniforms
from raysim.system.config import AvailabilityConfig
from raysim.system.traces import availability_trace


class Availability:
    """The availability of `num_clients` clients over simulated time. Queries come in non-decreasing time (the
    runs' clocks); an earlier time starts the Markov periods over from 0, so a resumed run gets the same answers."""

    def __init__(self, cfg: AvailabilityConfig, seed: int, num_clients: int):
        self.cfg, self.seed, self.n = cfg, seed, num_clients
        self._t = np.inf  # the Markov state's time; inf: not built
        self._trace: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def restricts(self) -> bool:
        """Whether some clients are ever unavailable."""
        return self.cfg.kind != "always"

    @property
    def drops(self) -> bool:
        """Whether a client can go offline while it trains or uploads (markov, diurnal, trace)."""
        return self.cfg.kind in ("markov", "diurnal", "trace")

    def available(self, t: float, round: int, purpose: str = "available") -> np.ndarray:
        """Which clients are online at simulated time `t` (bool, by client id); Bernoulli draws keyed by (round,
        purpose), one draw per selection."""
        kind = self.cfg.kind
        if kind == "always":
            return np.ones(self.n, dtype=bool)
        if kind == "bernoulli":
            return uniforms(self.seed, round, np.arange(self.n), purpose, 1)[:, 0] < self.cfg.p
        if kind == "diurnal":
            return self._cycle(t) < self.cfg.on_fraction
        if kind == "markov":
            self._advance(t)
            return self._on.copy()
        client, start, end = self._intervals()
        out = np.zeros(self.n, dtype=bool)
        out[client[(start <= t) & (t < end)]] = True
        return out

    def offline_at(self, clients: np.ndarray, t: float) -> np.ndarray:
        """When each of `clients`, online at `t`, goes offline next (inf: not before the run could end)."""
        ids = np.asarray(clients, dtype=np.int64)
        kind = self.cfg.kind
        if kind in ("always", "bernoulli"):
            return np.full(ids.size, np.inf)
        if kind == "diurnal":
            return t + (self.cfg.on_fraction - self._cycle(t)[ids]) * self.cfg.period
        if kind == "markov":
            self._advance(t)
            return self._next[ids].copy()
        client, start, end = self._intervals()
        now = (start <= t) & (t < end)
        ends = np.full(self.n, np.inf)
        ends[client[now]] = end[now]
        return ends[ids]

    def next_online(self, t: float) -> float:
        """The earliest time from `t` on at which a client offline at `t` comes online (inf: never); `t` itself
        under bernoulli, whose next selection draws afresh."""
        kind = self.cfg.kind
        if kind in ("always", "bernoulli"):
            return t
        if kind == "diurnal":
            cycle = self._cycle(t)
            off = cycle >= self.cfg.on_fraction
            return float(t + ((1.0 - cycle[off]) * self.cfg.period).min()) if off.any() else t
        if kind == "markov":
            self._advance(t)
            return float(self._next[~self._on].min()) if (~self._on).any() else t
        start = self._intervals()[1]
        later = start[start > t]
        return float(later.min()) if later.size else np.inf

    def ever(self) -> int:
        """How many clients are ever online (all but a trace's unlisted ones)."""
        return int(np.unique(self._intervals()[0]).size) if self.cfg.kind == "trace" else self.n

    def _cycle(self, t: float) -> np.ndarray:
        """Each client's position in its diurnal cycle at `t`, in [0, 1): from a keyed phase of its own."""
        phase = uniforms(self.seed, 0, np.arange(self.n), "diurnal", 1)[:, 0]
        return np.mod(t / self.cfg.period + phase, 1.0)

    def _intervals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._trace is None:
            assert self.cfg.file is not None  # AvailabilityConfig: a trace names its file
            self._trace = availability_trace(self.cfg.file, self.n)
        return self._trace

    def _periods(self, idx: np.ndarray) -> np.ndarray:
        """The next on or off period of clients `idx` (their current state's mean), each their switch count's draw."""
        mean = np.where(self._on[idx], self.cfg.mean_on, self.cfg.mean_off)
        out = np.empty(idx.size)
        for k in np.unique(self._count[idx]):
            sel = self._count[idx] == k
            out[sel] = -np.log1p(-uniforms(self.seed, int(k), idx[sel], "availability", 1)[:, 0]) * mean[sel]
        return out

    def _advance(self, t: float) -> None:
        """The Markov state at `t`: each client starts on with the stationary chance mean_on / (mean_on + mean_off)
        (its first period, memoryless, a full one), then alternates, each switch its own keyed draw."""
        if t < self._t:
            every = np.arange(self.n)
            p_on = self.cfg.mean_on / (self.cfg.mean_on + self.cfg.mean_off)
            self._on = uniforms(self.seed, 0, every, "availability_start", 1)[:, 0] < p_on
            self._count = np.zeros(self.n, dtype=np.int64)
            self._next = self._periods(every)
        self._t = t
        while True:
            due = np.flatnonzero(self._next <= t)
            if not due.size:
                return
            self._on[due] = ~self._on[due]
            self._count[due] += 1
            self._next[due] += self._periods(due)
