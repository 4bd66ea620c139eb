"""Cumulative per-run accounting: Definition 1's Gamma, simulated time, oracle calls, bytes."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from raysim.contract import Cost, Costs, as_costs
from raysim.system.model import RoundTiming


@dataclass
class Ledger:
    """Running totals over rounds; `oracle_calls` counts raw per-sample calls of clients and server,
    `download_bytes` the broadcast once per selected client (bytes only: the paper's time model
    charges uploads, not the broadcast)."""

    gamma: float = 0.0
    sim_time: float = 0.0
    oracle_calls: int = 0
    upload_bytes: int = 0
    download_bytes: int = 0

    def add(self, timing: RoundTiming, costs: Costs | list[Cost], server_cost: Cost, download_bytes: int = 0) -> dict:
        """Add one round (uploaded bytes of kept clients only, `download_bytes` of the round's
        broadcasts) and return the cumulative values."""
        costs = as_costs(costs)
        kept = ~np.asarray(timing.dropped, dtype=bool)[:len(costs)]  # a round without costs given books none
        return self.book(timing.gamma, timing.round_time, int(costs.oracle_calls.sum()) + server_cost.oracle_calls,
                         int(costs.upload_bytes[kept].sum()), download_bytes)

    def book(self, gamma: float, sim_time: float, oracle_calls: int, upload_bytes: int, download_bytes: int) -> dict:
        """Add one round's or server update's increments and return the cumulative values."""
        self.gamma += gamma
        self.sim_time += sim_time
        self.oracle_calls += oracle_calls
        self.upload_bytes += upload_bytes
        self.download_bytes += download_bytes
        return asdict(self)
