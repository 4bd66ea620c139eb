"""The YAML `sweep:` section: the search space, the metric and the scheduler (run by `raysim sweep`).

Its own module so the experiment schema (raysim.config) can include it without importing the sweep
runner, which imports the config in turn.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

if TYPE_CHECKING:
    import numpy as np

KINDS = ("grid", "choice", "uniform", "loguniform")


class Domain(BaseModel):
    """One dimension of the search space: exactly one of `grid`, `choice`, `uniform`, `loguniform`."""

    model_config = ConfigDict(extra="forbid")

    grid: list[Any] | None = Field(None, min_length=1, description="every value, in every combination")
    choice: list[Any] | None = Field(None, min_length=1, description="one value drawn per sample")
    uniform: tuple[float, float] | None = Field(None, description="[low, high], drawn uniformly")
    loguniform: tuple[float, float] | None = Field(None, description="[low, high], low > 0, drawn log-uniformly")

    @model_validator(mode="after")
    def _one_kind(self) -> "Domain":
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)} (got {given or 'none'})")
        bounds = self.uniform or self.loguniform
        if bounds is not None and not bounds[0] < bounds[1]:
            raise ValueError(f"{given[0]}: low must be below high (got {list(bounds)})")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError(f"loguniform: low must be > 0 (got {self.loguniform[0]})")
        return self

    def points(self, rng: np.random.Generator) -> list[Any]:
        """Values to validate before launching: every listed value, or both bounds and one draw."""
        if self.grid is not None:
            return list(self.grid)
        if self.choice is not None:
            return list(self.choice)
        bounds = self.uniform or self.loguniform
        assert bounds is not None  # _one_kind: a range when neither grid nor choice
        low, high = bounds
        draw = rng.uniform(low, high) if self.uniform else math.exp(rng.uniform(math.log(low), math.log(high)))
        return [low, float(draw), high]

    def to_tune(self) -> Any:
        """The Ray Tune search-space object."""
        from ray import tune

        if self.grid is not None:
            return tune.grid_search(self.grid)
        if self.choice is not None:
            return tune.choice(self.choice)
        if self.uniform:
            return tune.uniform(*self.uniform)
        assert self.loguniform is not None  # _one_kind: the one kind left
        return tune.loguniform(*self.loguniform)


class SchedulerConfig(BaseModel):
    """`fifo` runs every trial to the end; `asha` stops trials whose metric lags at a rung (Li et al. 2020)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fifo", "asha"] = "fifo"
    grace_period: int = Field(1, ge=1, description="rounds before ASHA may stop a trial")
    reduction_factor: float = Field(2.0, gt=1, description="ASHA keeps the top 1/reduction_factor at each rung")


class SearchConfig(BaseModel):
    """`basic`: every grid combination and random draws of the other domains (Tune's variant generator);
    `optuna`: Optuna's TPE sampler proposes each configuration from the results so far (the optuna extra)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["basic", "optuna"] = "basic"


class SweepConfig(BaseModel):
    """The `sweep:` section, read by `raysim sweep` only (`raysim run` ignores it)."""

    model_config = ConfigDict(extra="forbid")

    space: dict[str, Domain] = Field(..., min_length=1, description="dotted config field -> domain")
    metric: str = "test_accuracy"
    mode: Literal["min", "max"] = "max"
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    num_samples: int = Field(1, ge=1, description="samples of the space (a grid is repeated this many times)")
    concurrency: int | None = Field(None, ge=1, description="trials at once; default: as many as fit")
    trial_cpus: float | None = Field(None, gt=0, description="per trial; default: cluster CPUs / concurrency, else 1")
    trial_gpus: float | None = Field(None, ge=0, description="per trial; default: the same share of GPUs as of CPUs")
    storage_path: str = Field("runs/sweeps", description="sweeps go to <storage_path>/<name>-<time>/")
    search: SearchConfig = Field(default_factory=SearchConfig)
    seeds: int = Field(1, ge=1, description="runs of every configuration, with seeds seed, seed+1, ..., seed+seeds-1")

    @field_validator("search")
    @classmethod
    def _searchable(cls, search: SearchConfig, info: ValidationInfo) -> SearchConfig:
        grids = [k for k, d in info.data.get("space", {}).items() if d.grid is not None]
        if search.kind == "optuna" and grids:
            raise ValueError(f"optuna proposes every value itself; sweep.space.{grids[0]} is a grid (give it as choice)")
        return search

    @field_validator("seeds")
    @classmethod
    def _repeatable(cls, seeds: int, info: ValidationInfo) -> int:
        if seeds > 1 and "seed" in info.data.get("space", {}):
            raise ValueError("every configuration runs over seeds counted from `seed`; sweep.space cannot search seed too")
        scheduler = info.data.get("scheduler")
        if seeds > 1 and scheduler is not None and scheduler.kind == "asha":
            raise ValueError("scheduler asha stops single runs, so a configuration's mean would mix seeds stopped"
                             " at different rounds (use scheduler fifo with seeds)")
        return seeds
