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
        self.gamma += timing.gamma
        self.sim_time += timing.round_time
        costs = as_costs(costs)
        kept = ~np.asarray(timing.dropped, dtype=bool)[:len(costs)]  # a round without costs given books none
        self.oracle_calls += int(costs.oracle_calls.sum()) + server_cost.oracle_calls
        self.upload_bytes += int(costs.upload_bytes[kept].sum())
        self.download_bytes += download_bytes
        return asdict(self)
