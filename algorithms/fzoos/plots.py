"""Plots of the zeroth-order runs (the FZooS paper Figs. 1, 4, 6): F(x_r) (or its gap to F*) against
communication rounds and against total queries, for one run (`raysim report`) or several
algorithms on one figure (raysim.algorithms.fzoos.compare), and the per-step gradient cosine."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from raysim.report import register_report, save_figure
from raysim.results import RunResult


def by_round(rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per completed communication round (the last phase's row: its queries include the whole round)."""
    rows = rounds.dropna(subset=["objective"])
    return rows.groupby("zo_round", as_index=False).last()


def value_column(rounds: pd.DataFrame) -> tuple[str, str]:
    """The gap F - F* where known (log scale), else F."""
    return ("gap", "F(x_r) - F*") if "gap" in rounds and rounds["gap"].notna().any() else ("objective", "F(x_r)")


def plot_curves(curves: dict[str, pd.DataFrame], path: Path, title: str) -> Path:
    """Value against rounds and against queries, one line per named run."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, rounds in curves.items():
        col, label = value_column(rounds)
        data = by_round(rounds)
        for ax, x in zip(axes, ("zo_round", "oracle_calls")):
            ax.plot(data[x], data[col], marker="." if len(data) < 40 else None, label=name)
            ax.set_ylabel(label)
            if col == "gap" and (data[col] > 0).all():
                ax.set_yscale("log")
    axes[0].set_xlabel("communication round")
    axes[1].set_xlabel("total queries (all clients)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.suptitle(title)
    save_figure(fig, path)
    return path


def cosine_profile(rounds: pd.DataFrame, first: int = 2, last: int = 5) -> np.ndarray | None:
    """Fig. 4's y-axis: per-step cos(g_hat, grad F) averaged over rounds first..last, cumulative-averaged in t."""
    cols = sorted((c for c in rounds if c.startswith("grad_cos_t")), key=lambda c: int(c.removeprefix("grad_cos_t")))
    if not cols:
        return None
    data = by_round(rounds)
    per_step = data[(data["zo_round"] >= first) & (data["zo_round"] <= last)][cols].mean().to_numpy()
    return np.cumsum(per_step) / np.arange(1, len(per_step) + 1)


def plot_cosines(profiles: dict[str, np.ndarray], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, prof in profiles.items():
        ax.plot(np.arange(1, len(prof) + 1), prof, marker=".", label=name)
    ax.set_xlabel("local iteration t")
    ax.set_ylabel("cumulative mean cos(g_hat, grad F)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return path


@register_report("zo")
def report_zo(result: RunResult) -> list[Path]:
    """For runs of a zeroth-order family: value vs rounds and vs queries, and the cosine profile if logged."""
    rounds = result.rounds
    if "objective" not in rounds or "zo_round" not in rounds:
        return []
    written = [plot_curves({result.config["algorithm"]["name"]: rounds}, result.run_dir / "zo_value.png",
                           result.run_dir.name)]
    profile = cosine_profile(rounds)
    if profile is not None:
        written.append(plot_cosines({result.config["algorithm"]["name"]: profile}, result.run_dir / "zo_cosine.png"))
    return written
