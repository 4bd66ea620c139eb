"""The mistakes a user can make and fix: the CLI prints any of them as one line (exit status 2).

Everything else is a defect and keeps its traceback. Each class also derives from the built-in
exception a caller would expect (ValueError, FileNotFoundError), so `except ValueError` still works.
"""
from __future__ import annotations


def first_line(e: BaseException) -> str:
    """An exception's message cut to its first line (its type's name when it has none): the reason a one-line
    error quotes from a library's longer one."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class UserError(Exception):
    """A mistake in what the user gave (a file, a field, a value); the message says which and what to do."""


class ConfigError(UserError, ValueError):
    """An invalid experiment file or override: one problem per line, each naming its field.

    `source` (the file) prefixes the message; `problems` keeps the lines for callers that re-frame them.
    """

    def __init__(self, problems: str | list[str], source: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        where = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = where + self.problems[0]
        else:
            text = f"{where}{len(self.problems)} problems:\n  " + "\n  ".join(self.problems)
        super().__init__(text)


class PluginError(UserError, ValueError):
    """A plugin that cannot be found or imported; the message names it."""


class DataError(UserError, ValueError):
    """Data that cannot give the experiment asked for (a missing or unreadable file, too few samples); names the data.* field."""


class ClusterError(UserError, ConnectionError):
    """A Ray address that cannot be joined (`--address`, `cluster.address`); names it and Ray's reason."""


class RunDirError(UserError, FileNotFoundError):
    """A directory given as a run (`--resume`, `raysim report`) that is not one."""


class ExportError(UserError, ValueError):
    """A run whose trained model cannot be written as arrays (`raysim export`); names the run and the value."""


class DivergenceError(RuntimeError):
    """A metric became NaN or infinite; the rounds before it are saved (the CLI: one line, exit status 1)."""


class RunInterrupted(Exception):
    """SIGTERM or SIGINT stopped a run: its finished rounds are saved, with a checkpoint of the last one when it
    stopped at a round's end, and `run.json` says `interrupted`; `--resume` continues it to the same numbers.
    The CLI exits with 128 + the signal's number."""

    def __init__(self, signum: int, run_dir: object = None, rounds_done: int | None = None) -> None:
        import signal

        self.signum, self.run_dir, self.rounds_done = signum, run_dir, rounds_done
        self.name = signal.Signals(signum).name
        after = f" after round {rounds_done}" if rounds_done else " before its first round"
        where = f": `raysim run --resume {run_dir}` continues it" if run_dir is not None else ""
        super().__init__(f"interrupted by {self.name}{after}{where}")
