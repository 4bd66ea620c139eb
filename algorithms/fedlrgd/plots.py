"""FedLRGD report: the Appendix C histogram of approximate gradient ranks (the FedLRGD paper),
drawn when the run directory holds the `raysim rank` measurement (rank.parquet)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from raysim.algorithms.fedlrgd.rank import RANK_FILE, summarize  # noqa: E402
from raysim.report import register_report, save_figure  # noqa: E402
from raysim.results import RunResult  # noqa: E402


@register_report("fedlrgd_rank")
def rank_histogram(result: RunResult) -> list[Path]:
    """Histogram of the sampled coordinates' approximate ranks (out of k), as in the paper's Figs. 1-2."""
    path = result.run_dir / RANK_FILE
    if not path.exists():
        return []
    table = pd.read_parquet(path)
    k = int(table["k"].iloc[0])
    s = summarize(table["rank"].to_numpy(), k)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.hist(table["rank"], bins=np.arange(0.5, k + 1.5).tolist(), color="tab:blue", edgecolor="white")
    ax.set_xlabel(f"approximate rank (90% energy) of the {k} x {k} gradient matrix")
    ax.set_ylabel("coordinates")
    ax.set_title(f"{result.run_dir.name}: {s.coordinates} weights, median {s.median:g}, "
                 f"≤10: {s.share_le_10:.0%}, ≤5: {s.share_le_5:.0%}", fontsize=9)
    ax.grid(alpha=0.3)
    return [save_figure(fig, result.run_dir / "rank_histogram.png")]
