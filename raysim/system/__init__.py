"""The system model: sampled compute and upload times, stragglers, and Definition 1 accounting."""
from raysim.system.analytic import (
    erlang_cdf,
    erlang_quantile,
    expected_compute_phase,
    expected_explicit_drain,
    expected_max_erlang,
    explicit_queue_bound,
    gumbel_phase_estimate,
    paper_phase_estimate,
    prop2_bounds,
    von_mises_a,
)
from raysim.system.compute import compute_time, speed_factors
from raysim.system.config import (
    ClockConfig,
    CommConfig,
    ComputeConfig,
    StragglerConfig,
    SystemConfig,
)
from raysim.system.ledger import Ledger
from raysim.system.model import RoundTiming, SystemModel
from raysim.system.queue import burke_completions, explicit_completions, mm1_sojourn_times

__all__ = [
    "ClockConfig",
    "CommConfig",
    "ComputeConfig",
    "Ledger",
    "RoundTiming",
    "StragglerConfig",
    "SystemConfig",
    "SystemModel",
    "burke_completions",
    "compute_time",
    "erlang_cdf",
    "erlang_quantile",
    "expected_compute_phase",
    "expected_explicit_drain",
    "expected_max_erlang",
    "explicit_queue_bound",
    "explicit_completions",
    "gumbel_phase_estimate",
    "mm1_sojourn_times",
    "paper_phase_estimate",
    "prop2_bounds",
    "speed_factors",
    "von_mises_a",
]
