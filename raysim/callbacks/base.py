"""The callback interface: what a hook sees of the run and of the server, and how one stops a run."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


@dataclass(frozen=True)
class RunContext:
    """The run a callback serves: its directory, its validated config, and the round it starts after
    (0, or the checkpoint's round on `--resume`)."""

    run_dir: Path
    cfg: ExperimentConfig
    start_round: int


class ServerView:
    """A read-only view of the server: `state()` is a copy of the algorithm's server state, fetched only
    when a callback asks (from the server actor, when the server runs in one)."""

    def __init__(self, fetch: Callable[[], Any]):
        self._fetch = fetch

    def state(self) -> Any:
        """The algorithm's current server state, as a writable copy a callback may keep or change freely."""
        return copy.deepcopy(self._fetch())


class Callback:
    """Hooks around a run; override the ones you need. `on_round_end` returning False stops the run
    after that round (its status is then `stopped`, and `run.json` names the callback)."""

    def on_run_start(self, run: RunContext) -> None:
        """Called once the server and actors are up, before the first round."""

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        """Called after each round, with its row of rounds.parquet (on disk within a second: `raysim.results.RunWriter`)."""
        return None

    def on_run_end(self, run: RunContext, status: str) -> None:
        """Called once at the end: status `finished`, `stopped`, `interrupted` (SIGTERM, SIGINT) or `failed`."""


class RoundCallback(Callback):
    """A plain function of the row as a callback: `raysim.run(on_round=f)`."""

    def __init__(self, fn: Callable[[dict], bool | None]):
        self.fn = fn

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        return self.fn(row)
