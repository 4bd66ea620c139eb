"""The `raysim` command: run an experiment, report on a run, list what is available."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="raysim: federated optimization on Ray.")
console = Console()


@app.command()
def run(
    config: Path = typer.Argument(..., help="experiment YAML file"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides"),
    address: Optional[str] = typer.Option(None, help="Ray address (e.g. auto); default starts a local Ray"),
    out: Optional[Path] = typer.Option(None, help="write results exactly here instead of runs/<name>-<time>"),
    quiet: bool = typer.Option(False, help="no progress bar"),
) -> None:
    """Run an experiment and write its results."""
    from raysim.config import ConfigError
    from raysim.runner import run as run_experiment

    try:
        result = run_experiment(config, overrides or [], address=address, out=out, progress=not quiet)
    except ConfigError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2)
    last = result.rounds.iloc[-1]
    metrics = "  ".join(f"{k}={last[k]:.4f}" for k in ("test_accuracy", "test_loss", "train_loss") if k in last)
    steady = result.rounds["round_wall_s"].iloc[1:].mean() if len(result.rounds) > 1 else float("nan")
    console.print(f"{len(result.rounds)} rounds  {metrics}  sim_time={last['sim_time']:.1f}  gamma={last['gamma']:.1f}")
    console.print(f"start-up {result.info.get('startup_s', float('nan')):.2f} s, first round "
                  f"{result.rounds['round_wall_s'].iloc[0]:.3f} s, steady rounds {steady:.3f} s")
    console.print(f"results: {result.run_dir}")


@app.command()
def report(run_dir: Path = typer.Argument(..., help="a run directory")) -> None:
    """Write plots (metrics vs round, simulated time and Γ; client timeline) next to the results."""
    from raysim.report import report as make_report

    for path in make_report(run_dir):
        console.print(str(path))


@app.command("list")
def list_() -> None:
    """Show the algorithms, models, data sources and partitioners."""
    from raysim.data.partition import PARTITIONERS
    from raysim.data.sources import SOURCES
    from raysim.models import MODELS
    from raysim.registry import algorithms

    table = Table("kind", "available")
    table.add_row("algorithms", ", ".join(sorted(algorithms())))
    table.add_row("models", ", ".join(sorted(MODELS)))
    table.add_row("data sources", ", ".join(sorted(SOURCES)))
    table.add_row("partitioners", ", ".join(sorted(PARTITIONERS)))
    console.print(table)


if __name__ == "__main__":
    app()
