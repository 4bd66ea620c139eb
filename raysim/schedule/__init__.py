"""Aggregation schedules beyond the synchronous round: FedBuff's buffered and FedAsync's asynchronous aggregation
on one event-driven simulated clock (the `schedule:` section)."""
from raysim.schedule.config import ScheduleConfig, StalenessConfig
from raysim.schedule.staleness import staleness_weight

__all__ = ["ScheduleConfig", "StalenessConfig", "staleness_weight"]
