"""The system model: sampled compute and upload times, stragglers, and Definition 1 accounting.

The closed forms and bounds (scipy) live in `raysim.system.analytic`, imported only where used:
every actor process imports this package.
"""
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
from raysim.system.payload import payload_bytes
from raysim.system.queue import CarriedQueue, burke_completions, explicit_completions, mm1_sojourn_times

__all__ = [
    "CarriedQueue",
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
    "explicit_completions",
    "mm1_sojourn_times",
    "payload_bytes",
    "speed_factors",
]
