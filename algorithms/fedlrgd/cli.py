"""`raysim compare` (Γ and simulated time to accuracy ε, the FedLRGD paper) and `raysim rank` (App. C)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from raysim.cli import console, input_errors, numbers
from raysim.plugins import register_command


@register_command()
def compare(
    configs: List[Path] = typer.Argument(..., help="experiment YAML files on one problem (FedAvg ones are swept over b)"),
    epsilon: List[float] = typer.Option([1e-3], help="target accuracy F(θ) − F* ≤ epsilon; repeat for several"),
    b: str = typer.Option("1,5,10,20,50", help="local steps b for the FedAvg family, comma-separated"),
    out: Path = typer.Option(Path("runs/compare"), help="folder for the runs and compare.parquet / compare.md"),
    override: Optional[List[str]] = typer.Option(None, help="key.sub=value applied to every config"),
) -> None:
    """Run algorithms to accuracy epsilon; table of Γ, simulated time and rounds (the FedLRGD paper)."""
    from raysim.algorithms.fedlrgd.compare import compare as run_compare

    with input_errors(ValueError):
        table = run_compare(configs, tuple(epsilon), out, tuple(numbers(b, int, "--b")), override or [])
    view = Table(*["epsilon", "config", "algorithm", "b", "reached", "rounds", "gamma", "sim_time",
                   "gamma / best FedAvg", "final_suboptimality"])
    for r in table.itertuples():
        view.add_row(f"{r.epsilon:g}", r.config, r.algorithm, "" if r.b < 0 else str(r.b), str(r.reached),
                     f"{r.rounds:g}", f"{r.gamma:.0f}", f"{r.sim_time:.0f}", f"{r.gamma_over_best_fedavg:.3g}",
                     f"{r.final_suboptimality:.2e}")
    console.print(view)
    console.print(f"table: {out / 'compare.md'}")



@register_command()
def rank(
    config: Path = typer.Argument(..., help="experiment YAML training the network (e.g. configs/fedlrgd/fedlrgd_rank_digits.yaml)"),
    overrides: Optional[List[str]] = typer.Argument(None, help="key.sub=value overrides"),
    k: int = typer.Option(30, help="samples and perturbed parameters: k x k matrices"),
    out: Path = typer.Option(Path("runs/rank"), help="the run directory"),
) -> None:
    """Train through raysim, then measure the approximate rank of per-sample gradients (App. C)."""
    from raysim.algorithms.fedlrgd.rank import rank_run

    with input_errors(ValueError):
        s = rank_run(config, out, k, overrides or [])
    console.print(f"{s.coordinates} coordinates, k={s.k}: rank <= 5 {s.share_le_5:.1%}, rank <= 10 "
                  f"{s.share_le_10:.1%}, median {s.median:g}, max {s.max}")
    console.print(f"results: {out}/rank.parquet (raysim report {out} draws the histogram)")
