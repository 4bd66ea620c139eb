"""FedFisher's synthetic two-layer experiment, Fig. 1 (the FedFisher paper).

Run: python -m raysim.algorithms.fedfisher.figure1 [--out DIR] [--seeds S]

Width sweep (K = 2048, m in 32 128 512 2048) and local-steps sweep (m = 512, K in 16 ... 16384) of
raysim.algorithms.fedfisher.fisher.synthetic.experiment, one thread. Prints both tables (a row per swept value, a column per method, mean ±
population sd over seeds), writes DIR/fig1_synthetic.parquet (one row per sweep, width, K, seed, method) and
DIR/fig1_synthetic.png (error vs width, error vs K, one line per method), plus a small copy of the figure at
docs/figures/fedfisher/fig1_synthetic.png. DIR defaults to runs/fedfisher_synthetic.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from raysim.algorithms.fedfisher.fisher.synthetic import experiment, method_name  # noqa: E402
from raysim.report import save_figure  # noqa: E402
from raysim.storage.atomic import write_frame  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
WIDTHS = (32, 128, 512, 2048)
STEPS = (16, 64, 256, 1024, 4096, 16384)
WIDTH_SWEEP_STEPS = 2048
STEPS_SWEEP_WIDTH = 512
SERVER_STEPS = (1e4, 1e5, math.inf)
LABELS = {"fedavg": "FedAvg", method_name(1e4): "FedFisher T=1e4", method_name(1e5): "FedFisher T=1e5",
          method_name(math.inf): "FedFisher T=inf (pinv)", "local_fit": "local fit"}


def sweep(points: Sequence[tuple[str, int, int]], seeds: Sequence[int],
          server_steps: Sequence[float] = SERVER_STEPS) -> pd.DataFrame:
    """Long table (sweep, width, steps, seed, method, error) of experiment() at every (sweep, width, K) and seed."""
    rows = []
    for name, width, steps in points:
        start = time.perf_counter()
        for seed in seeds:
            for method, error in experiment(width, steps, seed, server_steps).items():
                rows.append({"sweep": name, "width": width, "steps": steps, "seed": seed, "method": method,
                             "error": error})
        print(f"  {name} sweep m={width} K={steps}: {len(seeds)} seeds in {time.perf_counter() - start:.1f} s",
              flush=True)
    return pd.DataFrame(rows)


def fig1_points(widths: Sequence[int] = WIDTHS, steps: Sequence[int] = STEPS) -> list[tuple[str, int, int]]:
    """The (sweep, width, K) points of Fig. 1a (K = 2048) and Fig. 1b (m = 512)."""
    return ([("width", m, WIDTH_SWEEP_STEPS) for m in widths]
            + [("steps", STEPS_SWEEP_WIDTH, k) for k in steps])


def summary(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """Mean and population sd (np.std) of the error per swept value and method, for one sweep."""
    key = "width" if name == "width" else "steps"
    part = table[table["sweep"] == name]
    return part.groupby([key, "method"])["error"].agg(mean="mean", sd=lambda e: e.std(ddof=0)).unstack("method")


def markdown(table: pd.DataFrame, name: str) -> str:
    """The sweep's table, a row per swept value and a column per method, cells `mean ± sd`."""
    s = summary(table, name)
    methods = [m for m in LABELS if m in s["mean"].columns]
    head = ["m" if name == "width" else "K"] + [LABELS[m] for m in methods]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for value in s.index:
        cells = [f"{s['mean'].at[value, m]:.4g} ± {s['sd'].at[value, m]:.3g}" for m in methods]
        lines.append(f"| {value} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(table: pd.DataFrame, path: Path, small: Path | None = None) -> list[Path]:
    """Two panels, error vs width (K = 2048) and error vs K (m = 512), seed means, log axes."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, name, xlabel in [(axes[0], "width", f"width m (K = {WIDTH_SWEEP_STEPS})"),
                             (axes[1], "steps", f"local steps K (m = {STEPS_SWEEP_WIDTH})")]:
        s = summary(table, name)
        for method, label in LABELS.items():
            if method not in s["mean"].columns:
                continue
            ax.plot(s.index, s["mean"][method], marker="o", label=label)
        ax.set(yscale="log", xlabel=xlabel, ylabel="global training error (1/N) Σ (f − y)²")
        ax.set_xscale("log", base=2)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    seeds = table["seed"].nunique()
    fig.suptitle(f"FedFisher synthetic two-layer ReLU net, M = 2, n = 100 (Fig. 1), mean of {seeds} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    paths = [path]
    if small is not None:
        small.parent.mkdir(parents=True, exist_ok=True)
        paths.append(save_figure(fig, small, dpi=80))
    else:
        plt.close(fig)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "fedfisher_synthetic")
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..S-1 (the paper: 50 for Fig. 1a, 10 for 1b)")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with threadpool_limits(1):
        table = sweep(fig1_points(), range(args.seeds))
    print(f"sweeps done in {time.perf_counter() - start:.0f} s\n")
    print(f"Width sweep (K = {WIDTH_SWEEP_STEPS}, {args.seeds} seeds, mean ± sd)\n{markdown(table, 'width')}\n")
    print(f"Local-steps sweep (m = {STEPS_SWEEP_WIDTH}, {args.seeds} seeds)\n{markdown(table, 'steps')}\n")
    write_frame(table, args.out / "fig1_synthetic.parquet")
    small = ROOT / "docs" / "figures" / "fedfisher" / "fig1_synthetic.png"
    for path in plot(table, args.out / "fig1_synthetic.png", small):
        print(f"wrote {path} ({path.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
