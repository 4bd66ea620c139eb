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
    config: Optional[Path] = typer.Argument(None, help="experiment YAML file (not with --resume)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides"),
    address: Optional[str] = typer.Option(None, help="Ray address (e.g. auto); default starts a local Ray"),
    out: Optional[Path] = typer.Option(None, help="write results exactly here instead of runs/<name>-<time>"),
    resume: Optional[Path] = typer.Option(None, help="continue the interrupted run in this directory from its last checkpoint"),
    quiet: bool = typer.Option(False, help="no progress bar"),
) -> None:
    """Run an experiment and write its results (or --resume an interrupted one)."""
    from raysim.config import ConfigError
    from raysim.runner import run as run_experiment

    if (config is None) == (resume is None):
        console.print("[red]give either CONFIG or --resume RUN_DIR[/red]")
        raise typer.Exit(2)
    try:
        result = run_experiment(config, overrides or [], address=address, out=out, progress=not quiet, resume=resume)
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


@app.command()
def sweep(
    config: Path = typer.Argument(..., help="experiment YAML file with a sweep: section"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides (sweep.* too)"),
    address: Optional[str] = typer.Option(None, help="Ray address (e.g. auto); default starts a local Ray"),
    out: Optional[Path] = typer.Option(None, help="write the sweep exactly here instead of <storage_path>/<name>-<time>"),
    quiet: bool = typer.Option(False, help="no Tune progress output"),
) -> None:
    """Run a Ray Tune search over the sweep: section; one simulation per trial."""
    from raysim.config import ConfigError
    from raysim.sweep import run_sweep, summary_table

    try:
        result = run_sweep(config, overrides or [], address=address, out=out, verbose=0 if quiet else 1)
    except ConfigError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2)
    console.print(summary_table(result))
    console.print(f"results: {result.sweep_dir / 'sweep_results.parquet'}")
    if result.best is None:
        raise typer.Exit(1)


@app.command()
def oneshot(
    config: Path = typer.Argument(..., help="experiment YAML file of a one-shot family"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides"),
    methods: str = typer.Option("fedavg,fisher_merge,regmean,fedfisher_diag,fedfisher_kfac,otfusion",
                                help="comma-separated one-shot methods"),
    seeds: str = typer.Option("0,1,2", help="comma-separated seeds"),
    out: Path = typer.Option(Path("runs/oneshot"), help="folder for the runs and oneshot.{parquet,md,png}"),
    address: Optional[str] = typer.Option(None, help="Ray address; default starts a local Ray"),
) -> None:
    """Run several one-shot methods (FedFisher and baselines) over seeds; write an accuracy table and plot."""
    from raysim.config import ConfigError
    from raysim.oneshot import compare

    try:
        compare(config, methods.split(","), [int(s) for s in seeds.split(",")], out, overrides or [], address)
    except (ConfigError, ValueError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2)
    console.print((out / "oneshot.md").read_text())
    console.print(f"results: {out}")


@app.command()
def compare(
    configs: List[Path] = typer.Argument(..., help="experiment YAML files on one problem (FedAvg ones are swept over b)"),
    epsilon: float = typer.Option(1e-3, help="target accuracy: F(θ) − F* ≤ epsilon"),
    b: str = typer.Option("1,5,10,20,50", help="local steps b for the FedAvg family, comma-separated"),
    out: Path = typer.Option(Path("runs/compare"), help="folder for the runs and compare.parquet / compare.md"),
    override: Optional[List[str]] = typer.Option(None, help="key.sub=value applied to every config"),
) -> None:
    """Run algorithms to accuracy epsilon; table of Γ, simulated time and rounds (specs/fedlrgd.md §7.15)."""
    from raysim.compare import compare as run_compare
    from raysim.config import ConfigError

    try:
        table = run_compare(configs, epsilon, out, tuple(int(v) for v in b.split(",")), override or [])
    except (ConfigError, ValueError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2)
    view = Table(*["config", "algorithm", "b", "reached", "rounds", "gamma", "sim_time", "final_suboptimality"])
    for r in table.itertuples():
        view.add_row(r.config, r.algorithm, "" if r.b < 0 else str(r.b), str(r.reached), f"{r.rounds:g}",
                     f"{r.gamma:.0f}", f"{r.sim_time:.0f}", f"{r.final_suboptimality:.2e}")
    console.print(view)
    console.print(f"table: {out / 'compare.md'}")


@app.command()
def rank(
    config: Path = typer.Argument(..., help="experiment YAML training the network (e.g. configs/fedlrgd_rank_digits.yaml)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides"),
    k: int = typer.Option(30, help="samples and perturbed parameters: k x k matrices"),
    out: Path = typer.Option(Path("runs/rank"), help="the run directory"),
) -> None:
    """Train through raysim, then measure the approximate rank of per-sample gradients (App. C)."""
    from raysim.config import ConfigError
    from raysim.rank import rank_run

    try:
        s = rank_run(config, out, k, overrides or [])
    except (ConfigError, ValueError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2)
    console.print(f"{s.coordinates} coordinates, k={s.k}: rank <= 5 {s.share_le_5:.1%}, rank <= 10 "
                  f"{s.share_le_10:.1%}, median {s.median:g}, max {s.max}")
    console.print(f"results: {out}/rank.parquet (raysim report {out} draws the histogram)")


@app.command()
def attack(
    config: Path = typer.Argument(..., help="attack YAML file (configs/sketch_attack.yaml)"),
    out: Path = typer.Option(Path("runs/sketch_attack"), help="folder for attack.parquet and attack.png"),
) -> None:
    """Gradient-leakage attack on sketched uploads: success vs sketch size b and vs DP ε̂ (specs/sketching.md §4)."""
    from pydantic import ValidationError

    from raysim.attack import load_attack_config, run_attack

    try:
        cfg = load_attack_config(config)
    except (ValidationError, OSError) as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2)
    for path in run_attack(cfg, out):
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
