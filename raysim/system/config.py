"""Pydantic models of the YAML `system:` section (the README's "The system model": Erlang compute, M/M/1 uploads)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ComputeConfig(BaseModel):
    """Delayed-Poisson compute: each oracle call takes `shift + Exp(rate)` time units.

    `unit` says what one call is: a per-sample gradient/query (`sample`, a minibatch step of B
    samples is B calls) or one minibatch step (`batch`). `speed: lognormal` draws one
    lognormal(0, speed_sigma) factor per client; a client's compute time is divided by it.
    `times: fixed` gives every call its mean, shift + 1/rate, with no randomness (closed-form checks).
    """

    model_config = ConfigDict(extra="forbid")

    times: Literal["erlang", "fixed"] = "erlang"
    shift: float = Field(1.0, ge=0)
    rate: float = Field(1.0, gt=0)
    unit: Literal["sample", "batch"] = "sample"
    speed: Literal["none", "lognormal"] = "none"
    speed_sigma: float = Field(0.5, ge=0)


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
