"""Cumulative per-run accounting: Definition 1's Gamma, simulated time, oracle calls, bytes."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from raysim.contract import Cost
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

    def add(self, timing: RoundTiming, costs: list[Cost], server_cost: Cost, download_bytes: int = 0) -> dict:
        """Add one round (uploaded bytes of kept clients only, `download_bytes` of the round's
        broadcasts) and return the cumulative values."""
        self.gamma += timing.gamma
        self.sim_time += timing.round_time
        self.oracle_calls += sum(c.oracle_calls for c in costs) + server_cost.oracle_calls
        self.upload_bytes += sum(c.upload_bytes for c, d in zip(costs, timing.dropped) if not d)
        self.download_bytes += download_bytes
        return asdict(self)
