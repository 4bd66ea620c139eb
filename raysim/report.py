"""`raysim report`: the plots researchers expect, written as PNGs next to a run's results."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from raysim import plugins  # noqa: E402
from raysim.results import RunResult  # noqa: E402

METRICS = ("test_accuracy", "test_loss", "train_loss")
AXES = (("round", "round"), ("sim_time", "simulated time"), ("gamma", "federated oracle complexity Γ"))

Reporter = Callable[[RunResult], list[Path]]
REPORTERS: dict[str, Reporter] = {}


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Lay out, write and close a figure; returns its path."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def register_report(name: str) -> Callable[[Reporter], Reporter]:
    """Decorator: `f(result) -> [written paths]` runs on every `raysim report`; return [] when the run does not fit."""

    def wrap(fn: Reporter) -> Reporter:
        REPORTERS[name] = fn
        return fn

    return wrap


def plot_metrics(result: RunResult) -> list[Path]:
    """One PNG per x-axis (round, simulated time, Γ), a panel per metric."""
    rounds = result.rounds
    metrics = [m for m in METRICS if m in rounds] or [
        c for c in rounds.columns if rounds[c].dtype.kind == "f" and c not in dict(AXES)][:3]
    written = []
    for x, label in AXES:
        fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4), squeeze=False)
        for ax, m in zip(axes[0], metrics):
            data = rounds[[x, m]].dropna()
            ax.plot(data[x], data[m], marker="." if len(data) < 60 else None)
            ax.set_xlabel(label)
            ax.set_ylabel(m)
            ax.grid(alpha=0.3)
        fig.suptitle(f"{result.run_dir.name}: metrics vs {label}")
        path = save_figure(fig, result.run_dir / f"metrics_vs_{x}.png")
        written.append(path)
    return written


def plot_timeline(result: RunResult) -> Path | None:
    """Per-client finish times within each round (kept and dropped clients), first 30 rounds."""
    clients = result.clients
    if clients.empty or "finish_time" not in clients:
        return None
    clients = clients[clients["round"] <= 30]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for dropped, color, name in ((False, "tab:blue", "kept"), (True, "tab:red", "dropped")):
        sel = clients[clients["dropped"] == dropped]
        ax.scatter(sel["round"], sel["finish_time"], s=8, color=color, label=name, alpha=0.7)
    ax.set_xlabel("round")
    ax.set_ylabel("client finish time (simulated, in round)")
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, result.run_dir / "client_timeline.png")


def report(run_dir: str | Path) -> list[Path]:
    """Write every plot of a run directory; returns the files written."""
    result = RunResult.load(run_dir)
    written = plot_metrics(result)
    timeline = plot_timeline(result)
    written += [timeline] if timeline else []
    plugins.load_builtin()
    for module in list(plugins.REPORT_MODULES):
        importlib.import_module(module)
    for reporter in REPORTERS.values():
        written += reporter(result)
    return written
