"""Callbacks that watch one evaluated metric: early stopping, and keeping the best model."""
from __future__ import annotations

import json
import math

from raysim.callbacks.base import Callback, RunContext, ServerView
from raysim.errors import ConfigError
from raysim.storage import checkpoint
from raysim.storage.atomic import write_text


class MetricWatch(Callback):
    """Tracks the best value of `metric` over the evaluated rounds (mode `max` or `min`; by default
    max for accuracies, min otherwise). A metric missing from an evaluated round is a config error."""

    def __init__(self, metric: str, mode: str | None = None, min_delta: float = 0.0, field: str = "callbacks"):
        self.metric, self.min_delta, self.field = metric, min_delta, field
        self.mode = mode or ("max" if "accuracy" in metric else "min")
        self.best: float | None = None
        self.best_round = 0
        self.run: RunContext | None = None

    def on_run_start(self, run: RunContext) -> None:
        self.run = run

    def improved(self, row: dict) -> bool | None:
        """Whether this round set a new best; None if the round was not evaluated."""
        if self.metric not in row or row[self.metric] is None:
            if self.run is not None and self.run.cfg.evaluates(row["round"]):
                raise ConfigError(f"{self.field}.metric: {self.metric!r} is not a result of this run; round "
                                  f"{row['round']} has {', '.join(sorted(k for k in row if k not in ('round', 'phase')))}")
            return None
        value = float(row[self.metric])
        if not math.isfinite(value):
            return False
        better = self.best is None or (value > self.best + self.min_delta if self.mode == "max"
                                       else value < self.best - self.min_delta)
        if better:
            self.best, self.best_round = value, row["round"]
        return better


class EarlyStopping(MetricWatch):
    """Stops the run once `metric` has not improved by more than `min_delta` for `patience`
    evaluations in a row (rounds between evaluations do not count)."""

    def __init__(self, metric: str, patience: int, mode: str | None = None, min_delta: float = 0.0,
                 field: str = "callbacks"):
        super().__init__(metric, mode, min_delta, field)
        self.patience = patience
        self.waited = 0

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        better = self.improved(row)
        if better is None:
            return None
        self.waited = 0 if better else self.waited + 1
        return False if self.waited >= self.patience else None


class BestModel(MetricWatch):
    """Keeps the server state of the best round so far in `RUN/best_model/` (`server.pkl`, and
    `best.json` with the round, the metric and its value); `raysim export` reads it."""

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        if self.improved(row) and self.run is not None:
            folder = self.run.run_dir / "best_model"
            checkpoint.save(checkpoint.dumps(server.state()), folder / "server.pkl")
            write_text(json.dumps({"round": self.best_round, "metric": self.metric, "value": self.best,
                                   "mode": self.mode}), folder / "best.json")
        return None
