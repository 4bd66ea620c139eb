"""Callbacks that write every round's scalars somewhere else: a CSV file, TensorBoard event files."""
from __future__ import annotations

import csv
import math
from numbers import Real
from pathlib import Path
from typing import Any, TextIO

from raysim.callbacks.base import Callback, RunContext, ServerView
from raysim.storage.atomic import write_text


def scalars(row: dict) -> dict[str, float]:
    """The row's finite numbers, without the round itself: what a logger plots against the round."""
    return {k: float(v) for k, v in row.items()
            if k != "round" and isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v)}


class CsvLogger(Callback):
    """Appends each round's row to a CSV file (default `RUN/rounds.csv`), flushed every round, so
    `tail -f` and spreadsheet tools see the run as it goes; columns are fixed by the first row."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else None
        self.file: TextIO | None = None
        self.writer: csv.DictWriter[str] | None = None

    def on_run_start(self, run: RunContext) -> None:
        self.path = self.path or run.run_dir / "rounds.csv"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if run.start_round and self.path.exists():  # a resumed run: the rows past its checkpoint come again
            with self.path.open(newline="") as f:
                kept = [line for line in f if not line[:1].isdigit() or int(line.split(",", 1)[0]) <= run.start_round]
            write_text("".join(kept), self.path)
        self.file = self.path.open("a" if run.start_round else "w", newline="")

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        assert self.file is not None, "on_run_start opens the file"
        if self.writer is None:
            self.writer = csv.DictWriter(self.file, fieldnames=list(row), extrasaction="ignore")
            if self.file.tell() == 0:
                self.writer.writeheader()
        self.writer.writerow(row)
        self.file.flush()
        return None

    def on_run_end(self, run: RunContext, status: str) -> None:
        if self.file is not None:
            self.file.close()


class TensorBoard(Callback):
    """Writes every numeric column of each round as a TensorBoard scalar (step = round) to event files
    in `RUN/tensorboard/` (or `log_dir`): `tensorboard --logdir RUN/tensorboard`."""

    def __init__(self, log_dir: str | Path | None = None):
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.writer: Any = None  # a tensorboardX SummaryWriter once the run starts (tensorboardX is untyped)

    def on_run_start(self, run: RunContext) -> None:
        from tensorboardX import SummaryWriter

        self.log_dir = self.log_dir or run.run_dir / "tensorboard"
        self.writer = SummaryWriter(str(self.log_dir), purge_step=run.start_round + 1 if run.start_round else None)

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=row["round"])
        self.writer.flush()
        return None

    def on_run_end(self, run: RunContext, status: str) -> None:
        if self.writer is not None:
            self.writer.close()
