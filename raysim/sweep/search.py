"""How a sweep proposes its trials: Tune's variant generator (`search: basic`) or Optuna (`search: optuna`),
each configuration repeated over `sweep.seeds` seeds through the trial index TRIAL_INDEX.

Ray Tune, which is slow to import, and Optuna, an optional extra, are imported inside the functions.
"""
from __future__ import annotations

from typing import Any

from raysim.config.sweep import SweepConfig
from raysim.sweep.trial import TRIAL_INDEX


def check_search(sweep: SweepConfig) -> None:
    """Refuse, before Ray starts, a search whose library is not installed."""
    from raysim.core.distribution import needs_extra
    from raysim.errors import ConfigError

    if sweep.search.kind == "optuna":
        try:
            import optuna  # noqa: F401
        except ImportError:
            raise ConfigError(needs_extra("sweep.search: kind optuna", "optuna")) from None


def param_space(sweep: SweepConfig) -> dict[str, Any]:
    """Tune's search space: one domain per `sweep.space` key, and for the variant generator with
    seeds > 1 a grid over the repeat index (Optuna's trials are repeated by `search_algorithm` instead)."""
    from ray import tune

    space = {k: d.to_tune() for k, d in sweep.space.items()}
    if sweep.search.kind == "basic" and sweep.seeds > 1:
        space[TRIAL_INDEX] = tune.grid_search(list(range(sweep.seeds)))
    return space


def search_algorithm(sweep: SweepConfig, seed: int) -> tuple[Any, int, int | None]:
    """(Tune search algorithm, Tune's num_samples, max_concurrent_trials) for the sweep.

    With seeds > 1 the variant generator draws a sample's random values once for all its grid points,
    so every seed of a configuration runs the same values. Optuna (TPE, seeded with `seed`) sits in
    Tune's Repeater, which runs each proposal `seeds` times and tells Optuna the mean over the seeds
    of the metric's last reported value: the number `sweep_configs.parquet` reports as `<metric>_mean`.
    """
    from ray.tune.search import BasicVariantGenerator, Repeater

    if sweep.search.kind == "basic":
        generator = BasicVariantGenerator(constant_grid_search=sweep.seeds > 1, max_concurrent=sweep.concurrency or 0)
        return generator, sweep.num_samples, None
    from ray.tune.search.optuna import OptunaSearch

    optuna = OptunaSearch(metric=sweep.metric, mode=sweep.mode, seed=seed)
    return Repeater(optuna, repeat=sweep.seeds), sweep.num_samples * sweep.seeds, sweep.concurrency
