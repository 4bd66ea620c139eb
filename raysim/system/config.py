"""Pydantic models of the YAML `system:` section (the README's "The system model": Erlang compute, M/M/1 uploads)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator


def _absolute_path(path: str | None) -> str | None:
    """A trace file's path made absolute where the config is read (the driver), so every process finds the file."""
    return None if path is None else str(Path(path).expanduser().resolve())


TracePath = Annotated[str | None, AfterValidator(_absolute_path)]


class ComputeConfig(BaseModel):
    """Delayed-Poisson compute: each oracle call takes `shift + Exp(rate)` time units.

    `unit` says what one call is: a per-sample gradient/query (`sample`, a minibatch step of B
    samples is B calls) or one minibatch step (`batch`). A client's compute time is divided by its speed factor,
    drawn once, so slow devices stay slow: `none` 1, `constant` speed_factor for all, `lognormal` one
    lognormal(0, speed_sigma) draw per client, `trace` a Parquet or CSV file of `client_id, speed` listing every
    client. `times: fixed` gives every call its mean, shift + 1/rate, with no randomness (closed-form checks).
    """

    model_config = ConfigDict(extra="forbid")

    times: Literal["erlang", "fixed"] = "erlang"
    shift: float = Field(1.0, ge=0)
    rate: float = Field(1.0, gt=0)
    unit: Literal["sample", "batch"] = "sample"
    speed: Literal["none", "constant", "lognormal", "trace"] = "none"
    speed_sigma: float = Field(0.5, ge=0)
    speed_factor: float = Field(1.0, gt=0, description="speed: constant")
    speed_file: TracePath = Field(None, description="speed: trace, a Parquet or CSV file of client_id, speed")

    @model_validator(mode="after")
    def _trace_named(self) -> "ComputeConfig":
        if self.speed == "trace" and not self.speed_file:
            raise ValueError("speed: trace needs speed_file, a Parquet or CSV file of client_id, speed")
        return self


class AvailabilityConfig(BaseModel):
    """When clients can take part: `always`; `bernoulli`, each client available with probability p at each
    selection; `markov`, on and off periods of Exp(mean_on) and Exp(mean_off) simulated time, each client
    starting in its stationary state; `diurnal`, available for `on_fraction` of every `period` from a phase of its
    own; `trace`, the intervals [start, end) of a Parquet or CSV file of `client_id, start, end`. Only available
    clients are selected (sync) or started (buffered, async); under markov, diurnal and trace a client that goes
    offline before its upload is done never delivers (its work is charged and its row says `offline`)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["always", "bernoulli", "markov", "diurnal", "trace"] = "always"
    p: float = Field(0.5, gt=0, le=1, description="bernoulli: the chance a client is available at a selection")
    mean_on: float = Field(100.0, gt=0, description="markov: the mean online period, in simulated time")
    mean_off: float = Field(100.0, gt=0, description="markov: the mean offline period")
    period: float = Field(24.0, gt=0, description="diurnal: the cycle, in simulated time")
    on_fraction: float = Field(0.5, gt=0, le=1, description="diurnal: the share of each cycle a client is online")
    file: TracePath = Field(None, description="trace: a Parquet or CSV file of client_id, start, end")

    @model_validator(mode="after")
    def _trace_named(self) -> "AvailabilityConfig":
        if self.kind == "trace" and not self.file:
            raise ValueError("kind: trace needs file, a Parquet or CSV file of client_id, start, end")
        return self


class CommConfig(BaseModel):
    """Upload queue: `burke` (paper, phi*Erlang drain) or an `explicit` M/M/1 queue from empty.

    `phi` is the communication-to-computation ratio; `nu` the service rate of the explicit queue
    (arrival rate 1), which must exceed 1 for the queue to be stable.
    """

    model_config = ConfigDict(extra="forbid")

    mode: Literal["burke", "explicit"] = "burke"
    phi: float = Field(1.0, ge=0)
    nu: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _stable_queue(self) -> "CommConfig":
        if self.mode == "explicit" and self.nu <= 1:
            raise ValueError(
                f"the M/M/1 upload queue is unstable with nu={self.nu}: arrivals have rate 1, "
                "so explicit mode needs a service rate nu > 1"
            )
        return self


class StragglerConfig(BaseModel):
    """Optional straggler handling: a deadline (simulated time) and/or over-selection."""

    model_config = ConfigDict(extra="forbid")

    deadline: float | None = Field(None, gt=0)
    over_select: int = Field(0, ge=0)


class ClockConfig(BaseModel):
    """`virtual` sums sampled times; `real` sleeps them, `time_scale` real seconds per unit."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["virtual", "real"] = "virtual"
    time_scale: float = Field(0.01, gt=0)


class SystemConfig(BaseModel):
    """The whole `system:` section."""

    model_config = ConfigDict(extra="forbid")

    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    comm: CommConfig = Field(default_factory=CommConfig)
    stragglers: StragglerConfig = Field(default_factory=StragglerConfig)
    clock: ClockConfig = Field(default_factory=ClockConfig)
    availability: AvailabilityConfig = Field(default_factory=AvailabilityConfig)
