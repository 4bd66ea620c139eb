"""Shared helpers for the system-model tests."""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from raysim.contract import Cost
from raysim.system import RoundTiming, SystemModel


def play_round(
    model: SystemModel,
    round: int,
    costs: list[Cost],
    server_cost: Cost = Cost(),
    keep: int | None = None,
) -> RoundTiming:
    """Run one round the way the runner does: compute times, stragglers, then close the round."""
    clients = np.arange(len(costs))
    times = model.client_compute_times(round, clients, costs)
    dropped, _ = model.stragglers(clients, times, keep)
    server_time = model.server_compute_time(round, server_cost)
    return model.close_round(round, clients, times, costs, server_cost, server_time, dropped, keep)


@pytest.fixture
def run_round() -> Callable[..., RoundTiming]:
    return play_round
