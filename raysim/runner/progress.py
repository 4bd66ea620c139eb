"""What a run tells the person watching it, through the `raysim` logger: the start-up phases, then the rounds:
a bar with ETA on a terminal, and with output piped (a log file, `ray job submit`, a batch scheduler) one
plain line every `every_rounds` rounds or `every_s` seconds, whichever comes later, and at the last round.

The library only logs; `configure_logging` (called by the CLI) routes the logger to stderr at the level of
RAYSIM_LOG_LEVEL, `--verbose` (DEBUG) or `--quiet` (WARNING), INFO by default.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from typing import Callable

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)

from raysim.errors import UserError

LOGGER = logging.getLogger("raysim")
LEVEL_ENV = "RAYSIM_LOG_LEVEL"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_HANDLER_MARK = "_raysim_cli"


def log_level(verbose: bool = False, quiet: bool = False) -> int:
    """RAYSIM_LOG_LEVEL if set (one of LEVELS), else DEBUG with --verbose, WARNING with --quiet, else INFO."""
    env = os.environ.get(LEVEL_ENV, "").strip().upper()
    if env:
        if env not in LEVELS:
            raise UserError(f"{LEVEL_ENV}={os.environ[LEVEL_ENV]!r}: allowed {', '.join(LEVELS)}")
        return getattr(logging, env)
    return logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO


class StderrHandler(logging.StreamHandler):
    """A StreamHandler that writes to whatever `sys.stderr` is at the time of each record, so a logger configured
    once keeps working after stderr is replaced (pytest's capture, a notebook, a redirected stream)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(verbose: bool = False, quiet: bool = False) -> int:
    """Send the raysim logger to stderr (rich on a terminal, time-stamped plain lines otherwise); its level."""
    level = log_level(verbose, quiet)
    for old in [h for h in LOGGER.handlers if getattr(h, _HANDLER_MARK, False)]:
        LOGGER.removeHandler(old)
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(console=Console(stderr=True), show_path=False)
    else:
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s raysim %(levelname)s %(message)s", "%H:%M:%S"))
    setattr(handler, _HANDLER_MARK, True)
    LOGGER.addHandler(handler)
    LOGGER.setLevel(level)
    LOGGER.propagate = False
    return level


def metric_text(row: dict) -> str:
    """The round's headline metric, e.g. 'test_accuracy 0.9132' (empty between evaluations)."""
    for key in ("test_accuracy", "test_loss", "train_loss", "objective"):
        if row.get(key) is not None:
            return f"{key} {row[key]:.4f}"
    return ""


LONG_RUN_S = 86_400.0  # a run whose first round says it will take longer than this is warned about (a day)


class RunProgress:
    """Progress of one run's rounds: `update(row)` after each round. A rich bar with ETA when `bar` is on and
    stderr is a terminal; otherwise log lines at INFO (none when `bar` is off and nothing is piped either)."""

    def __init__(self, name: str, total: int, done: int, enabled: bool, every_rounds: int = 1, every_s: float = 10.0,
                 interactive: bool | None = None, clock: Callable[[], float] = time.monotonic):
        self.name, self.total, self.done, self.enabled = name, total, done, enabled
        self.every_rounds, self.every_s, self.clock = every_rounds, every_s, clock
        self.interactive = (sys.stderr.isatty() or Console().is_jupyter) if interactive is None else interactive
        self.bar: Progress | None = None
        self.start = self.last_time = clock()
        self.first, self.last_round = done, done

    def __enter__(self) -> RunProgress:
        if self.enabled and self.interactive:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[metric]}"), TextColumn("sim {task.fields[sim]:.1f}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True),
            )
            self.bar.start()
            self.task = self.bar.add_task(self.name, total=self.total, completed=self.done, metric="", sim=0.0)
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()

    def update(self, row: dict) -> None:
        """Record a finished round (its rounds.parquet row)."""
        r = int(row["round"])
        now = self.clock()
        if r == self.first + 1:
            self._warn_if_long(r, now - self.start)
        if self.bar is not None:
            self.bar.update(self.task, completed=r, metric=metric_text(row), sim=row["sim_time"])
            return
        if not self.enabled:
            return
        due = r - self.last_round >= self.every_rounds and now - self.last_time >= self.every_s
        if due or r == self.total or r == self.first + 1:
            elapsed = now - self.start
            eta = elapsed / (r - self.first) * (self.total - r)
            LOGGER.info("%s: round %d/%d  %s  sim_time %.1f  elapsed %.0f s  ETA %.0f s", self.name, r, self.total,
                        metric_text(row), row["sim_time"], elapsed, eta)
            self.last_round, self.last_time = r, now

    def _warn_if_long(self, r: int, first_s: float) -> None:
        """One warning, with or without progress output, when the remaining rounds at the first one's pace would take
        over LONG_RUN_S: `algorithm.rounds: 1e12` is legal, but more likely a typo than a plan."""
        eta = first_s * (self.total - r)
        if eta > LONG_RUN_S:
            LOGGER.warning("%s: %d more rounds at %.3g s a round would take about %.3g days; check algorithm.rounds=%d",
                           self.name, self.total - r, first_s, eta / 86_400, self.total)
