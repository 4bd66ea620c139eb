"""How rounds.parquet names the distribution of a per-client metric over the evaluated clients."""
from __future__ import annotations

SUMMARY_QUANTILES = (10, 50, 90)


def summary_names(metric: str) -> list[str]:
    """The columns summarizing per-client `metric`: its sample-weighted mean, std and 10th, 50th and 90th
    percentiles (`client_<metric>_mean`, ...)."""
    return [f"client_{metric}_{s}" for s in ("mean", "std", *(f"p{q}" for q in SUMMARY_QUANTILES))]
