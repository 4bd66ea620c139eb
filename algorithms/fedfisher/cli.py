"""`raysim oneshot`: several one-shot methods over seeds, an accuracy table and a plot."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from raysim.cli import console, input_errors, numbers
from raysim.plugins import register_command


@register_command()
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
    from raysim.algorithms.fedfisher.oneshot import compare

    with input_errors(ValueError):
        compare(config, methods.split(","), numbers(seeds, int, "--seeds"), out, overrides or [], address)
    console.print((out / "oneshot.md").read_text())
    console.print(f"results: {out}")
