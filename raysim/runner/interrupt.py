"""SIGTERM (a batch scheduler, `ray job stop`) and SIGINT (Ctrl-C) during a run: the first one lets the round in
flight finish, after which the runner saves the tables and a checkpoint and stops; a second one, or one before the
rounds begin, stops at once (raysim.errors.RunInterrupted). Either way the run resumes to the same numbers."""
from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from raysim.errors import RunInterrupted
from raysim.runner.progress import LOGGER

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """The run's handlers for SIGINT and SIGTERM while it lasts (main thread only: elsewhere signals cannot be
    caught); `install` again after `ray.init`, which sets its own SIGTERM handler. `at_round_end` is whether a
    first signal waits for the round in flight; `received` is the first signal's number."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.at_round_end = False
        self.previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self.previous.setdefault(s, signal.signal(s, self._handle))
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first, self.received = self.received is None, self.received or signum
        if first and self.at_round_end:
            LOGGER.warning("%s: stopping after this round, with a checkpoint (send it again to stop at once)",
                           signal.Signals(signum).name)
            return
        raise RunInterrupted(signum)

    def __enter__(self) -> StopSignals:
        return self.install()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
