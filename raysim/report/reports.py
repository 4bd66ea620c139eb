"""`raysim report`: the plots researchers expect, written as PNGs next to a run's results."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

import matplotlib.pyplot as plt
import numpy as np

from raysim import plugins
from raysim.report.figures import AXES, METRICS, metric_columns, save_figure, tidy_x, wants_log
from raysim.report.schedule import plot_schedule
from raysim.report.timeline import plot_timeline
from raysim.results import RunResult

Reporter = Callable[[RunResult], list[Path]]
REPORTERS: dict[str, Reporter] = {}


def register_report(name: str, replace: bool = False) -> Callable[[Reporter], Reporter]:
    """Decorator: `f(result) -> [written paths]` runs on every `raysim report`; return [] when the run does not fit;
    `replace` to take the name of another module's reporter."""

    def wrap(fn: Reporter) -> Reporter:
        plugins.claim(REPORTERS, "report", name, fn, replace)
        return fn

    return wrap


def plot_metrics(result: RunResult) -> list[Path]:
    """One PNG per x-axis (round, simulated time, Γ), a panel per metric (the standard ones, else the run's first three)."""
    rounds = result.rounds
    metrics = [m for m in METRICS if m in rounds] or metric_columns(rounds)[:3]
    written = []
    for x, label in AXES:
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
        for ax, m in zip(axes[0], metrics):
            data = rounds[[x, m]].dropna()
            ax.plot(data[x], data[m], marker="." if len(data) < 60 else None)
            ax.set_xlabel(label)
            tidy_x(ax)
            ax.set_ylabel(m)
            ax.set_yscale("log" if wants_log(data[m]) else "linear")
            ax.grid(alpha=0.3)
        fig.suptitle(f"{result.run_dir.name}: metrics vs {label}")
        written.append(save_figure(fig, result.run_dir / f"metrics_vs_{x}.png"))
    return written


def plot_client_eval(result: RunResult) -> Path | None:
    """The federated evaluation's per-client distribution over rounds (`eval.clients`): a box per evaluated round
    (10th-90th percentile whiskers) and the sample-weighted mean, a panel per metric; None without one."""
    ev = result.client_eval
    if ev is None or ev.empty:
        return None
    metrics = [m for m in ("accuracy", "loss") if m in ev] or [c for c in ev.columns if c not in (
        "round", "client_id", "samples", "split") and ev[c].dtype.kind == "f"][:2]
    rounds = sorted(ev["round"].unique())
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.6), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        groups = [ev.loc[ev["round"] == r, [m, "samples"]].dropna() for r in rounds]
        ax.boxplot([g[m] for g in groups], positions=rounds, widths=max(0.6, 0.5 * min(np.diff(rounds), default=1)),
                   whis=(10, 90), showfliers=False, manage_ticks=False)
        ax.plot(rounds, [np.average(g[m], weights=g["samples"]) if len(g) else np.nan for g in groups], "o-",
                label="sample-weighted mean")
        ax.set_xlabel("round")
        tidy_x(ax)
        ax.set_ylabel(f"client {m}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{result.run_dir.name}: federated evaluation, one box of clients per round")
    return save_figure(fig, result.run_dir / "client_eval.png")


def report(run_dir: str | Path) -> list[Path]:
    """Write every plot of a run directory; returns the files written."""
    result = RunResult.load(run_dir)
    written = plot_metrics(result)
    timeline = plot_schedule(result) or plot_timeline(result)  # one clock, or a round's own
    per_client = plot_client_eval(result)
    written += [p for p in (timeline, per_client) if p]
    plugins.load_builtin()
    for module in list(plugins.REPORT_MODULES):
        importlib.import_module(module)
    for reporter in REPORTERS.values():
        written += reporter(result)
    return written
