"""The `raysim` command: run an experiment, report on a run, list what is available."""
from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import List, Optional, TypeVar

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_show_locals=False,
                  help="raysim: federated optimization on Ray. A mistake in the input is one line and exit status 2;"
                       " add --debug anywhere (or set RAYSIM_DEBUG=1) for the traceback.")
console = Console(soft_wrap=True)
BUILTIN_COMMANDS = ("run", "sweep", "report", "retime", "export")  # need no family command; `list` shows them all
errors = Console(stderr=True, soft_wrap=True)  # one error, one line: never wrapped at the terminal width
N = TypeVar("N", int, float)


def numbers(text: str, kind: type[N], flag: str) -> list[N]:
    """A comma-separated option of numbers (`--seeds 0,1,2`); a value that is none: one line naming `flag`."""
    from raysim.errors import ConfigError

    values = []
    for v in text.split(","):
        try:
            values.append(kind(v))
        except ValueError:
            raise ConfigError(f"{flag} {text}: {v!r} is not {'an integer' if kind is int else 'a number'}") from None
    return values


@contextlib.contextmanager
def input_errors(*kinds: type[Exception]) -> Iterator[None]:
    """A family command's mistakes in its input as UserErrors, which `main` prints in one line on stderr with exit
    status 2: what its own parsing raises (`kinds`, e.g. ValueError) becomes a ConfigError; a UserError passes."""
    from raysim.errors import ConfigError, UserError, first_line

    try:
        yield
    except UserError:
        raise
    except kinds as e:
        raise ConfigError(first_line(e)) from e


@app.command()
def run(
    config: Optional[Path] = typer.Argument(None, help="experiment YAML file (not with --resume)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides"),
    address: Optional[str] = typer.Option(None, help="Ray address (e.g. auto); default starts a local Ray"),
    out: Optional[Path] = typer.Option(None, help="write results exactly here (a new or empty directory) instead of runs/<name>-<time>"),
    overwrite: bool = typer.Option(False, help="with --out: replace the run already there (its files are removed first)"),
    resume: Optional[Path] = typer.Option(None, help="continue the interrupted run in this directory from its last intact checkpoint"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress, only warnings and errors"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="debug messages too"),
    plugin: Optional[List[str]] = typer.Option(None, help="load this plugin first (module or .py file); repeatable"),
) -> None:
    """Run an experiment and write its results (or --resume an interrupted one). Progress goes to stderr: a bar
    on a terminal, a line every 10 s otherwise; RAYSIM_LOG_LEVEL (DEBUG, INFO, WARNING, ERROR) overrides the flags.
    SIGTERM or Ctrl-C stops after the round in flight with a checkpoint (a second one at once); exit 128+signal."""
    from raysim.errors import UserError
    from raysim.runner.progress import configure_logging
    from raysim.runner import run as run_experiment

    if (config is None) == (resume is None):
        raise UserError("give either CONFIG or --resume RUN_DIR" if config is None else
                        "give either CONFIG or --resume RUN_DIR, not both (a resumed run uses the config saved with it)")
    quiet = configure_logging(verbose, quiet) > logging.INFO
    _load(plugin)
    if config is not None:
        _require_command(config, "run", "sweep")
    if overwrite and out is None:
        raise UserError("--overwrite replaces the run in --out DIR: give --out too")
    result = run_experiment(config, overrides or [], address=address, out=out, progress=not quiet, resume=resume,
                            overwrite=overwrite)
    last = result.rounds.iloc[-1]
    metrics = "  ".join(f"{k}={last[k]:.4f}" for k in ("test_accuracy", "test_loss", "train_loss") if k in last)
    steady = result.rounds["round_wall_s"].iloc[1:].mean() if len(result.rounds) > 1 else float("nan")
    console.print(f"{len(result.rounds)} rounds  {metrics}  sim_time={last['sim_time']:.1f}  gamma={last['gamma']:.1f}")
    console.print(f"start-up {result.info.get('startup_s', float('nan')):.2f} s, first round "
                  f"{result.rounds['round_wall_s'].iloc[0]:.3f} s, steady rounds {steady:.3f} s")
    console.print(f"results: {result.run_dir}")


@app.command()
def report(
    run_dirs: List[Path] = typer.Argument(..., help="one run directory, or several to compare"),
    out: Optional[Path] = typer.Option(None, help="write the comparison here (default report/); with one run, compare it alone"),
    metric: Optional[List[str]] = typer.Option(None, help="compare only this metric; repeatable (default: every shared one)"),
) -> None:
    """One run: plots (metrics vs round, simulated time and Γ; client timeline; the family's own) next to its
    results. Several runs (or --out): one figure per metric with the runs overlaid, in --out. A sweep's directory:
    its trials overlaid (seeds as mean ± std bands), in SWEEP/report."""
    if len(run_dirs) == 1 and (run_dirs[0] / "sweep_results.parquet").exists():
        from raysim.sweep.results import trial_dirs

        sweep, run_dirs = run_dirs[0], trial_dirs(run_dirs[0])
        out = out or sweep / "report"
    elif len(run_dirs) == 1 and out is None and not metric:
        from raysim.report import report as make_report

        for path in make_report(run_dirs[0]):
            console.print(str(path))
        return
    from raysim.report.compare import compare

    written, skipped = compare(run_dirs, out or Path("report"), metric)
    for path in written:
        console.print(str(path))
    for name, runs in skipped.items():
        console.print(f"skipped {name}: only in {', '.join(runs)}")


@app.command()
def retime(
    run_dir: Path = typer.Argument(..., help="a finished (or stopped) run directory"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="system.key=value under the new system model; repeatable"),
    out: Optional[Path] = typer.Option(None, help="write here instead of runs/<name>-retimed-<time>"),
) -> None:
    """Re-time a run under another system model from its recorded costs, without retraining."""
    from raysim.results import RunResult
    from raysim.results.retime import retime as retime_run

    result = retime_run(run_dir, set_ or [], out)
    before, after = RunResult.load(run_dir).rounds.iloc[-1], result.rounds.iloc[-1]
    console.print(f"{len(result.rounds)} rounds  sim_time {before['sim_time']:.1f} -> {after['sim_time']:.1f}"
                  f"  gamma {before['gamma']:.1f} -> {after['gamma']:.1f}")
    console.print(f"results: {result.run_dir}")


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="a finished (or stopped) run directory"),
    out: Optional[Path] = typer.Option(None, help="write here (a file, or an existing directory to hold model.pt /"
                                       " model.npz) instead of RUN/model.pt (RUN/model.npz for array models)"),
    best: bool = typer.Option(False, help="the best round kept by the best_model callback, not the newest checkpoint"),
) -> None:
    """Save a run's trained model: a torch state_dict for build_model of the run's model config, or arrays."""
    from raysim.results.export import export as export_model

    path, trained = export_model(run_dir, out, best)
    console.print(f"{path}: the model after round {trained.round}")


@app.command()
def sweep(
    config: Optional[Path] = typer.Argument(None, help="experiment YAML file with a sweep: section (not with --resume)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides (sweep.* too)"),
    address: Optional[str] = typer.Option(None, help="Ray address (e.g. auto); default starts a local Ray"),
    out: Optional[Path] = typer.Option(None, help="write the sweep exactly here instead of <storage_path>/<name>-<time>"),
    resume: Optional[Path] = typer.Option(None, help="continue the interrupted sweep in this directory; finished trials are kept"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no Tune progress output, only warnings and errors"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="debug messages too"),
    plugin: Optional[List[str]] = typer.Option(None, help="load this plugin first (module or .py file); repeatable"),
) -> None:
    """Run a Ray Tune search over the sweep: section (or --resume an interrupted one); one simulation per trial."""
    from raysim.errors import UserError
    from raysim.runner.progress import configure_logging
    from raysim.sweep import run_sweep
    from raysim.sweep.results import summary_table

    if (config is None) == (resume is None):
        raise UserError("give either CONFIG or --resume SWEEP_DIR" if config is None else
                        "give either CONFIG or --resume SWEEP_DIR, not both (a resumed sweep uses the config saved with it)")
    quiet = configure_logging(verbose, quiet) > logging.INFO
    _load(plugin)
    if config is not None:
        _require_command(config, "sweep", "run")
    result = run_sweep(config, overrides or [], address=address, out=out, resume=resume, verbose=0 if quiet else 1)
    console.print(summary_table(result, console.width))
    console.print(f"results: {result.sweep_dir / 'sweep_results.parquet'}"
                  + (f", {result.sweep_dir / 'sweep_configs.parquet'}" if result.configs is not None else ""))
    if result.best is None:
        raise typer.Exit(1)


@app.command("list")
def list_(plugin: Optional[List[str]] = typer.Option(None, help="also load this plugin (module or .py file)")) -> None:
    """Show the algorithms, models, data sources, partitioners and commands, built-in and from plugins."""
    from raysim import plugins
    from raysim.data.partition import NATURAL

    _load(plugin)
    table = Table("kind", "available")
    table.add_row("algorithms", ", ".join(plugins.ALGORITHMS.names()))
    table.add_row("models", ", ".join(plugins.MODELS.names()))
    table.add_row("data sources", ", ".join(plugins.SOURCES.names()))
    table.add_row("partitioners", ", ".join(plugins.PARTITIONERS.names(NATURAL)))
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)  # an app of several commands
    table.add_row("commands", ", ".join(sorted(c.name or "" for c in group.commands.values())))
    console.print(table)


def _load(specs: list[str] | None) -> None:
    """Import `--plugin` modules or files (a bad one raises PluginError, which names it)."""
    from raysim.plugins import load_plugin

    for spec in specs or []:
        load_plugin(spec)


def _require_command(config: Path, *accepted: str) -> None:
    """A config file declares the command that runs it (`command:`, default run); another command
    answers in one line with the one to use."""
    from raysim.config import declared_command
    from raysim.errors import ConfigError

    declared = declared_command(config)
    if declared is not None and declared not in accepted:
        raise ConfigError(f"the file is for `raysim {declared}`: run `raysim {declared} {config}`", str(config))


def _argv_plugins(argv: list[str]) -> list[str]:
    """The `--plugin X` / `--plugin=X` values of a command line, loaded before parsing so a plugin's commands exist."""
    found = [a.split("=", 1)[1] for a in argv if a.startswith("--plugin=")]
    found += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--plugin"]
    return found


def add_plugin_commands(argv: list[str] | None = None) -> typer.Typer:
    """Add every plugin's commands (built-in families, installed plugins, `--plugin` files) to the app."""
    import importlib

    from raysim import plugins

    plugins.load_builtin()
    for module in list(plugins.COMMAND_MODULES):  # the built-ins' commands first: a plugin's of the same name is refused
        importlib.import_module(module)
    _load(_argv_plugins(argv or []))
    for module in list(plugins.COMMAND_MODULES):
        importlib.import_module(module)
    known = {c.name or getattr(c.callback, "__name__", "") for c in app.registered_commands}
    for name, fn in plugins.COMMANDS.items():
        if name not in known:
            app.command(name)(fn)
    return app


def main(argv: list[str] | None = None) -> int:
    """The `raysim` console script; returns the exit status.

    A user's mistake (`raysim.errors.UserError`) is one line on stderr and status 2, a diverged run
    one line and status 1; `--debug` anywhere on the command line, or RAYSIM_DEBUG=1, shows the traceback.
    """
    import os
    import sys

    from raysim.errors import DivergenceError, RunInterrupted, UserError

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("RAYSIM_DEBUG", "") not in ("", "0")
    args = [a for a in args if a != "--debug"]
    command = next((a for a in args if not a.startswith("-")), None)
    try:
        if command in BUILTIN_COMMANDS:  # the families' own commands are not needed: import no family up front
            _load(_argv_plugins(args))
        else:
            add_plugin_commands(args)
        app(args=args, prog_name="raysim")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except (UserError, DivergenceError) as e:
        if debug:
            raise
        errors.print(f"error: {e}", style="red", markup=False, highlight=False)
        return 2 if isinstance(e, UserError) else 1
    except RunInterrupted as e:
        errors.print(str(e), style="yellow", markup=False, highlight=False)
        return 128 + e.signum
    return 0


def entry_point() -> int:
    """The installed `raysim` command: `main`, then an exit without Python's last garbage collection, which
    walked every object of the finished run (torch, Ray, pandas: about 1.2 s) although nothing of it is left
    to finalize: results, trackers and Ray are closed before `main` returns."""
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":
    raise SystemExit(entry_point())
