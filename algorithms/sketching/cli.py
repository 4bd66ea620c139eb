"""`raysim attack`: the gradient-leakage attack on sketched uploads (the sketching paper)."""
from __future__ import annotations

from pathlib import Path

import typer

from raysim.cli import console
from raysim.plugins import register_command


@register_command()
def attack(
    config: Path = typer.Argument(..., help="attack YAML file (configs/sketching/sketch_attack.yaml)"),
    out: Path = typer.Option(Path("runs/sketch_attack"), help="folder for attack.parquet and attack.png"),
) -> None:
    """Gradient-leakage attack on sketched uploads: success vs sketch size b and vs DP ε̂ (the sketching paper)."""
    from raysim.algorithms.sketching.attack import load_attack_config, run_attack

    cfg = load_attack_config(config)
    for path in run_attack(cfg, out):
        console.print(str(path))
