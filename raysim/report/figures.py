"""What every raysim figure shares: the Agg backend, the x axes a run is read against, which rounds
columns are metrics, and when a y axis reads better on a log scale."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from raysim.storage.atomic import atomic_write_bytes  # noqa: E402

METRICS = ("test_accuracy", "test_loss", "train_loss")  # drawn first, in this order, where a run has them
AXES = (("round", "round"), ("sim_time", "simulated time (s)"), ("gamma", "federated oracle complexity Γ"))
# rounds columns that describe the round (schedule, costs, host measurements), not the model: never plotted as a metric
ROUND_COLUMNS = frozenset({"round", "phase", "clients", "selected", "dropped", "gamma", "sim_time", "oracle_calls",
                           "upload_bytes", "download_bytes", "server_oracle_calls", "server_oracle_batches",
                           "round_sim_time", "round_wall_s", "wall_s", "client_cpu_s", "actor_restarts", "checkpoint",
                           "available", "offline", "arrivals", "staleness_mean", "staleness_max", "in_flight"})


def metric_columns(rounds: pd.DataFrame) -> list[str]:
    """The numeric rounds columns that measure the model: METRICS first, then the family's own in table order."""
    numeric = [c for c in rounds.columns if c not in ROUND_COLUMNS and rounds[c].dtype.kind in "fiu"]
    return [m for m in METRICS if m in numeric] + [c for c in numeric if c not in METRICS]


def wants_log(values: pd.Series, spread: float = 30.0) -> bool:
    """A y axis reads better on a log scale when every value is positive and they span more than `spread` times."""
    values = values.dropna()
    return len(values) > 1 and bool((values > 0).all()) and float(values.max()) > spread * float(values.min())


def tidy_x(ax) -> None:
    """At most six x ticks, with large values (Γ, simulated seconds) in powers of ten, so labels never run together."""
    ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
    ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 4))


def save_figure(fig, path: Path, dpi: int = 110, legend_outside: bool = False) -> Path:
    """Lay out, write and close a figure; returns its path. `legend_outside`: grow the saved area to hold a legend
    placed outside the axes (one more layout pass, so only where asked)."""
    fig.tight_layout()
    atomic_write_bytes(path, lambda tmp: fig.savefig(tmp, format=path.suffix.lstrip(".") or None, dpi=dpi,
                                                     bbox_inches="tight" if legend_outside else None))
    plt.close(fig)
    return path
