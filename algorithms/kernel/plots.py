"""Plots of the kernel FedAvg/FedProx family (the kernel FedAvg/FedProx paper): per-run curves for
`raysim report`, and the paper's figures drawn from several runs or sweep tables
(raysim.algorithms.kernel.figures): gradient norm and error vs round, FG vs heterogeneity, 1/MSE vs N."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from raysim.report import register_report, save_figure  # noqa: E402
from raysim.results import RunResult  # noqa: E402

KERNEL_ALGORITHMS = ("kernel_fedavg", "kernel_fedprox")
ROUND_METRICS = (  # (column, axis label); the *_prev columns describe f_{t-1}, plotted at t - 1
    ("grad_norm_sec61_prev", "‖∇ℓ(θ)‖ (Sec. 6.1)"),
    ("coef_error", "‖θ_t − θ*‖"),
    ("pred_error_prev", "‖f − f*‖²_N (in-sample)"),
    ("test_error", "test MSE against f*"),
)


def _curve(rounds: pd.DataFrame, column: str) -> tuple[pd.Series, pd.Series]:
    """(round, value) of the rounds that have `column` (evaluated every `eval.every` rounds: the rest are NaN
    and would leave isolated points that draw no line)."""
    part = rounds[rounds[column].notna()]
    return (part["round"] - 1 if column.endswith("_prev") else part["round"]), part[column]


def plot_series(series: dict[str, pd.DataFrame], metrics, path: Path, title: str) -> Path:
    """One log-scale panel per metric (column, label), one line per labelled run's rounds table."""
    metrics = [(c, lab) for c, lab in metrics if any(c in r for r in series.values())]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.4 * len(metrics), 3.5), squeeze=False)
    for ax, (column, label) in zip(axes[0], metrics):
        for name, rounds in series.items():
            if column in rounds:
                ax.plot(*_curve(rounds, column), label=name)
        ax.set_yscale("log")
        ax.set_xlabel("communication round")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path, dpi=90)
    return path


def plot_panels(panels: dict[str, dict[str, pd.DataFrame]], metric: tuple[str, str], path: Path, title: str) -> Path:
    """One log-scale panel per entry of `panels` ({panel title: {label: rounds table}}), all showing `metric`."""
    column, label = metric
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4), sharey=True, squeeze=False)
    for ax, (panel, series) in zip(axes[0], panels.items()):
        for name, rounds in series.items():
            ax.plot(*_curve(rounds, column), label=name)
        ax.set_yscale("log")
        ax.set_xlabel("communication round")
        ax.set_title(panel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(label)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path, dpi=90)
    return path


@register_report("kernel")
def kernel_rounds(result: RunResult) -> list[Path]:
    """A kernel run: gradient norm, errors against f*, and FG_j per round (where reported)."""
    if result.config.get("algorithm", {}).get("name") not in KERNEL_ALGORITHMS:
        return []
    rounds = result.rounds
    gains = [(c, c.replace("fg_client_", "FG client ")) for c in rounds.columns if c.startswith("fg_client_")]
    label = result.run_dir.name
    return [plot_series({label: rounds}, [*ROUND_METRICS, *gains], result.run_dir / "kernel_rounds.png",
                        f"{label}: kernel FedAvg/FedProx")]


def plot_gain(table: pd.DataFrame, x: str, xlabel: str, path: Path, title: str) -> Path:
    """Mean FG over trials of the data-scarce and the data-rich client vs `x`, one line per algorithm with a
    band of +-1 standard error (table columns: x, algorithm, client in {scarce, rich}, fg, one row per
    trial), the mean of an optional `closed_form` column as a dotted line, and the break-even line FG = 1."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, client in zip(axes, ("scarce", "rich")):
        part = table[table["client"] == client]
        for algorithm, rows in part.groupby("algorithm", sort=False):
            rows = rows.groupby(x)["fg"].agg(["mean", "sem"]).fillna(0.0)
            line, = ax.plot(rows.index, rows["mean"], marker=".", label=algorithm)
            ax.fill_between(rows.index, rows["mean"] - rows["sem"], rows["mean"] + rows["sem"],
                            color=line.get_color(), alpha=0.12, lw=0)
        if "closed_form" in part:
            closed = part.groupby(x)["closed_form"].mean()
            ax.plot(closed.index, closed.to_numpy(), color="k", ls=":", lw=1.5, label="closed form")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_title(f"data-{client} client")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("federation gain FG")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path, dpi=90)
    return path


def plot_inverse_mse(table: pd.DataFrame, path: Path, title: str) -> Path:
    """MSE and 1/MSE vs N, one line per algorithm (table columns: N, algorithm, mse: trial means)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for algorithm, rows in table.groupby("algorithm", sort=False):
        axes[0].plot(rows["N"], rows["mse"], marker=".", label=algorithm)
        axes[1].plot(rows["N"], 1.0 / rows["mse"], marker=".", label=algorithm)
    for ax, label in zip(axes, ("MSE  ∫|f̂ − f*|²", "1 / MSE")):
        ax.set_xlabel("N")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path, dpi=90)
    return path
