"""`raysim report RUN1 RUN2 ...`: several runs overlaid, one figure per metric with a panel per x axis
(round, simulated time, Γ), so runs are compared at equal rounds, equal time and equal oracle cost."""
from __future__ import annotations

from collections.abc import Sequence

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from raysim.callbacks.trackers import tracked
from raysim.errors import UserError
from raysim.report.figures import AXES, metric_columns, save_figure, tidy_x, wants_log
from raysim.results import RunResult


def legend_labels(results: list[RunResult]) -> list[str]:
    """Legend names: the config values that tell the runs apart (`algorithm.lr=0.3, seed=1`: a sweep's trials by
    their parameters, not their directories), else `run_labels`."""
    return differing_values(results) or run_labels(results)


def run_labels(results: list[RunResult]) -> list[str]:
    """The runs' names in messages: the run directory's name, after the config's name where the directory does not
    hold it; the directory as given where two runs would read the same."""
    def label(result: RunResult, where: str) -> str:
        config = result.run_dir / "config.yaml"
        name = result.config.get("name") if config.exists() else None
        return where if not name or name in where else f"{name} ({where})"

    labels = [label(r, r.run_dir.name) for r in results]
    if len(set(labels)) < len(labels):
        labels = [label(r, str(r.run_dir)) for r in results]
    return labels


def differing_values(results: list[RunResult]) -> list[str] | None:
    """Each run's values of the config fields that differ between the runs (what a tracker logs, `name` aside), or
    None where no field does, a run has no config, or two runs would read the same."""
    if len(results) < 2 or not all((r.run_dir / "config.yaml").exists() for r in results):
        return None
    params = [tracked(r.config) for r in results]
    keys = sorted({k for p in params for k in p} - {"name"})
    differ = [k for k in keys if len({repr(p.get(k)) for p in params}) > 1]
    labels = [", ".join(f"{k}={p.get(k)}" for k in differ) for p in params]
    return labels if differ and len(set(labels)) == len(labels) else None


def shared_metrics(results: list[RunResult], labels: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The metrics every run has (in the first run's order), and each other metric with the runs that have it."""
    columns = [metric_columns(r.rounds) for r in results]
    seen = list(dict.fromkeys(c for cols in columns for c in cols))
    shared = [m for m in seen if all(m in cols for cols in columns)]
    skipped = {m: [lab for lab, cols in zip(labels, columns) if m in cols] for m in seen if m not in shared}
    return shared, skipped


def overlay_figure(metric: str, results: list[RunResult], labels: list[str]):
    """`metric` against round, simulated time and Γ, one line per run, a shared legend below."""
    fig, axes = plt.subplots(1, len(AXES), figsize=(4.4 * len(AXES), 3.6), squeeze=False)
    values = []
    for result, label in zip(results, labels):
        rounds = result.rounds
        for ax, (x, _) in zip(axes[0], AXES):
            data = rounds[[x, metric]].dropna()
            ax.plot(data[x], data[metric], marker="." if len(data) < 40 else None, linewidth=1.2, label=label)
        values.append(rounds[metric])
    log = wants_log(pd.concat(values))
    for ax, (_, name) in zip(axes[0], AXES):
        ax.set_xlabel(name)
        tidy_x(ax)
        ax.set_ylabel(metric + (" (log scale)" if log else ""))
        ax.set_yscale("log" if log else "linear")
        ax.grid(alpha=0.3, which="both" if log else "major")
    fig.suptitle(f"{metric}: {len(results)} runs")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(names), 4), fontsize=8,
               frameon=False)
    return fig


def compare(run_dirs: Sequence[str | Path], out: str | Path = "report", metrics: list[str] | None = None
            ) -> tuple[list[Path], dict[str, list[str]]]:
    """Write compare_<metric>.png into `out` for each metric every run has (or each of `metrics`); returns the
    files written and the metrics skipped, each with the runs that have it. Every directory is checked before
    anything is written (RunDirError for one that is not a run)."""
    results = [RunResult.load(d) for d in run_dirs]
    labels = run_labels(results)
    shared, skipped = shared_metrics(results, labels)
    if metrics:
        missing = [m for m in metrics if m not in shared]
        if missing:
            raise UserError(f"--metric {missing[0]}: not a metric of every run given; shared: {', '.join(shared) or 'none'}")
        shared = list(metrics)
    if not shared:
        raise UserError("the runs share no metric column: " + "; ".join(
            f"{lab} has {', '.join(metric_columns(r.rounds)) or 'none'}" for lab, r in zip(labels, results)))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    legends = legend_labels(results)
    written = [save_figure(overlay_figure(m, results, legends), out / f"compare_{m}.png", legend_outside=True)
               for m in shared]
    return written, skipped
