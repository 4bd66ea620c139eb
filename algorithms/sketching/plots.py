"""Plots of iterative sketching (the sketching paper): error vs rounds and vs uploaded bytes per
sketch kind, the privacy accountants, and the attack's success vs sketch size b and vs ε̂."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from raysim.report import register_report, save_figure  # noqa: E402
from raysim.results import RunResult  # noqa: E402

ERROR_METRICS = ("train_loss", "test_loss", "test_accuracy")


def _label(config: dict) -> str:
    a = config["algorithm"]
    label = f"{a['sketch']} b={a['b_sketch'] or 'd'} K={a['local_steps']}"
    return label + (f" ε̂={a['dp']['epsilon']:g}" if a.get("dp") else "")


def _sketching_runs(result: RunResult) -> list[RunResult]:
    """This run and its sibling sketching runs of the same experiment name (e.g. runs/sketch_comm/<kind>)."""
    runs = [result]
    for sibling in sorted(result.run_dir.parent.iterdir()):
        if sibling == result.run_dir or not (sibling / "rounds.parquet").exists() or not (sibling / "config.yaml").exists():
            continue
        other = RunResult.load(sibling)
        if other.config["algorithm"]["name"] == "sketching" and other.config["name"] == result.config["name"]:
            runs.append(other)
    return runs


@register_report("sketching")
def plot_sketching(result: RunResult) -> list[Path]:
    """Error vs round and vs cumulative uploaded bytes, one line per sibling run (sketch kind, b, ε̂)."""
    if result.config["algorithm"]["name"] != "sketching":
        return []
    runs = _sketching_runs(result)
    metrics = [m for m in ERROR_METRICS if m in result.rounds]
    fig, axes = plt.subplots(len(metrics), 2, figsize=(10, 3.2 * len(metrics)), squeeze=False)
    for run in runs:
        rounds = run.rounds
        for row, m in enumerate(metrics):
            data = rounds[["round", "upload_bytes", m]].dropna()
            for col, x in enumerate(("round", "upload_bytes")):
                axes[row, col].plot(data[x], data[m], label=_label(run.config))
    for row, m in enumerate(metrics):
        for col, x in enumerate(("round", "uploaded bytes (all clients, cumulative)")):
            ax = axes[row, col]
            ax.set_xlabel(x)
            ax.set_ylabel(m)
            ax.grid(alpha=0.3)
            if m.endswith("loss"):
                ax.set_yscale("log")
            if col == 1:
                ax.set_xscale("log")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"{result.config['name']}: error vs rounds and vs uplink")
    path = save_figure(fig, result.run_dir / "sketching_error.png")
    written = [path]
    if "dp_eps_advanced" in result.rounds:
        written.append(plot_accountants(result))
    return written


def plot_accountants(result: RunResult) -> Path:
    """ε of the run after each round: the paper's composition, advanced composition, RDP and exact."""
    rounds = result.rounds
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for col, name in (("dp_eps_paper", "paper, as stated (Thm 6.2)"), ("dp_eps_advanced", "advanced composition (H.3)"),
                      ("dp_eps_rdp", "Rényi DP"), ("dp_eps_exact", "exact Gaussian")):
        data = rounds[["round", col]].dropna()
        ax.plot(data["round"], data[col], label=name)
    ax.set_xlabel("round")
    ax.set_ylabel("ε (at the rigorous total δ; paper: its own δ)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, result.run_dir / "privacy_accountants.png")


def plot_attack(table: pd.DataFrame, path: Path, input_dim: int) -> Path:
    """Success rate and median relative error vs b (no DP) and vs ε̂ (one line per sketch size)."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    by_b = table[table["sweep"] == "b"].groupby("b").agg(success=("success", "mean"), err=("rel_error", "median"))
    if len(by_b):
        axes[0].plot(by_b.index, by_b["success"], marker="o")
        axes[0].axvline(input_dim, color="gray", ls="--", label=f"b = m = {input_dim}")
        axes[0].set_xscale("log")
        axes[0].legend()
    axes[0].set_xlabel("sketch size b")
    axes[0].set_ylabel("success rate (exact recovery)")
    dp = table[table["sweep"] == "epsilon"]
    for b, group in dp.groupby("b"):
        cell = group.groupby("epsilon").agg(ok=("rel_error", lambda e: (e < 0.1).mean()), err=("rel_error", "median"))
        axes[1].plot(cell.index, cell["ok"], marker="o", label=f"b = {b}")
        axes[2].plot(cell.index, cell["err"], marker="o", label=f"b = {b}")
    for ax, ylabel in ((axes[1], "share of trials with rel. error < 0.1"), (axes[2], "median relative error")):
        ax.set_xscale("log")
        ax.set_xlabel("per-step ε̂")
        ax.set_ylabel(ylabel)
        if len(dp):
            ax.legend()
    axes[2].set_yscale("log")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle("gradient-leakage attack on sketched uploads")
    save_figure(fig, path)
    return path
