"""Pydantic models of the YAML `schedule:` section: sync rounds (the default), FedBuff's buffered aggregation
(Nguyen et al., 2022) and FedAsync (Xie et al., 2019)."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class StalenessConfig(BaseModel):
    """How much a late update counts, as a function of its staleness s (server versions since its model was sent):
    `constant` 1; `polynomial` (1+s)^-a; `hinge` 1 while s <= b, then 1/(a(s-b)+1) (both FedAsync's); `fedbuff`
    1/sqrt(1+s) (FedBuff's)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["constant", "polynomial", "hinge", "fedbuff"] = "constant"
    a: float = Field(0.5, ge=0, description="polynomial exponent, or the hinge's slope")
    b: float = Field(4.0, ge=0, description="the hinge's threshold")


class ScheduleConfig(BaseModel):
    """When the server applies updates. `sync`: rounds (today's). `buffered`: `concurrency` clients train at once,
    each freed slot starts another client from the current model, and every `buffer` arrivals make one server update.
    `async`: buffer 1, each arrival mixed in with weight `alpha` times the staleness function. `semi_sync`: each
    round starts `clients_per_round` clients and closes after `period` of simulated time with what arrived; a late
    update is applied in a later round with its staleness (`max_staleness: 0` discards it instead). Updates staler
    than `max_staleness` are dropped and counted. `algorithm.rounds` counts server updates."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["sync", "buffered", "async", "semi_sync"] = "sync"
    concurrency: int | None = Field(None, ge=1, description="C, clients training at once; default clients_per_round")
    buffer: int | None = Field(None, ge=1, description="K, arrivals per server update (buffered); default: concurrency")
    alpha: float = Field(0.6, gt=0, le=1, description="FedAsync's mixing weight")
    staleness: StalenessConfig | None = Field(None, description="default: fedbuff (buffered), polynomial a=0.5 (async)")
    max_staleness: int | None = Field(None, ge=0, description="updates staler than this are dropped and counted")
    period: float | None = Field(None, gt=0, description="semi_sync: a round closes every `period` of simulated time")

    def problems(self) -> list[str]:
        """Fields given that the kind does not use, as `schedule.field: problem` lines."""
        if self.kind == "sync":
            given = [n for n in ("concurrency", "buffer", "staleness", "max_staleness", "period")
                     if getattr(self, n) is not None]
            return [f"schedule.{n}: for the buffered, async and semi_sync schedules, not kind 'sync'" for n in given]
        if self.kind == "async" and self.buffer not in (None, 1):
            return [f"schedule.buffer: async applies every arrival (buffer 1), got {self.buffer}; use kind 'buffered'"]
        if self.kind == "semi_sync":
            if self.period is None:
                return ["schedule.period: semi_sync closes its rounds every `period` of simulated time; give it"]
            given = [n for n in ("concurrency", "buffer") if getattr(self, n) is not None]
            return [f"schedule.{n}: semi_sync starts clients_per_round clients a round; it has no {n}" for n in given]
        if self.period is not None:
            return [f"schedule.period: for the semi_sync schedule, not kind {self.kind!r}"]
        return []

    @property
    def scheduled(self) -> bool:
        """Whether updates follow arrivals on the event-driven clock (buffered or async), not rounds."""
        return self.kind != "sync"

    def resolved(self, clients_per_round: int) -> ScheduleConfig:
        """This schedule with its defaults filled in: C = clients_per_round, K = C (buffered) or 1 (async), and the
        papers' staleness functions."""
        c = self.concurrency or clients_per_round
        k = 1 if self.kind == "async" else (self.buffer or c)
        s = self.staleness or (StalenessConfig(kind="fedbuff") if self.kind == "buffered"
                               else StalenessConfig(kind="polynomial", a=0.5))  # async and semi_sync
        return self.model_copy(update={"concurrency": c, "buffer": k, "staleness": s})
