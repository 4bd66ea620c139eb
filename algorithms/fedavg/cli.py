"""`raysim schedules`: FedBuff and FedAsync against synchronous FedAvg over the spread of client speeds."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from raysim.cli import console, input_errors, numbers
from raysim.plugins import register_command


@register_command()
def schedules(
    config: Path = typer.Argument(..., help="an experiment with a buffered schedule (e.g. configs/fedavg/fedbuff.yaml)"),
    sigma: str = typer.Option("0.1,1,1.5", help="log-normal spreads of the client speeds, comma-separated"),
    target: float = typer.Option(0.9, help="the test accuracy to reach"),
    out: Path = typer.Option(Path("runs/schedules"), help="folder for the runs and schedules.parquet / schedules.md"),
    override: Optional[List[str]] = typer.Option(None, help="key.sub=value applied to every run"),
) -> None:
    """Simulated time, Γ and wall time to a target accuracy: FedBuff, FedAsync and synchronous FedAvg (K and C
    clients a round) over the spread of client speeds."""
    from raysim.algorithms.fedavg.schedules import compare_schedules

    with input_errors(ValueError):
        table = compare_schedules(config, tuple(numbers(sigma, float, "--sigma")), target, out, override or [])
    view = Table(*["σ", "schedule", "K", "C", "updates", "sim time", "Γ", "/ sync", "acc.", "wall s"])
    for r in table.itertuples():
        view.add_row(f"{r.sigma:g}", r.schedule, str(r.clients_per_update), str(r.concurrency),
                     f"{r.updates:.0f}" if r.reached else "-", f"{r.sim_time:.0f}", f"{r.gamma:.0f}",
                     f"{r.time_ratio:.3f}", f"{r.final_accuracy:.3f}", f"{r.wall_s:.1f}")
    console.print(view)
    console.print(f"K: clients an update, C: clients at once; sim time and Γ to test accuracy {target:g}, / sync: the"
                  f" sim time over synchronous FedAvg's with K a round. Table: {out / 'schedules.md'}")
