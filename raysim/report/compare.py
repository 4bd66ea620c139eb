"""`raysim report RUN1 RUN2 ...`: several runs overlaid, one figure per metric with a panel per x axis
(round, simulated time, Γ), so runs are compared at equal rounds, equal time and equal oracle cost."""
from __future__ import annotations

from collections.abc import Sequence

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from raysim.callbacks.trackers import tracked
from raysim.errors import UserError
from raysim.storage.atomic import make_dir
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


def _values_apart(results: list[RunResult], aside: set[str]) -> list[str] | None:
    """Each run's `key=value, ...` of the config fields (what a tracker logs, those in `aside` left out) whose values
    differ between the runs ('' where none do); None where a run has no config."""
    if not all((r.run_dir / "config.yaml").exists() for r in results):
        return None
    params = [tracked(r.config) for r in results]
    keys = sorted({k for p in params for k in p} - aside)
    differ = [k for k in keys if len({repr(p.get(k)) for p in params}) > 1]
    return [", ".join(f"{k}={p.get(k)}" for k in differ) for p in params]


def differing_values(results: list[RunResult]) -> list[str] | None:
    """Each run's values of the config fields that differ between the runs (`name` aside), or None where no field
    does, a run has no config, or two runs would read the same."""
    labels = _values_apart(results, {"name"}) if len(results) > 1 else None
    return labels if labels and all(labels) and len(set(labels)) == len(labels) else None


def shared_metrics(results: list[RunResult], labels: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The metrics every run has (in the first run's order), and each other metric with the runs that have it."""
    columns = [metric_columns(r.rounds) for r in results]
    seen = list(dict.fromkeys(c for cols in columns for c in cols))
    shared = [m for m in seen if all(m in cols for cols in columns)]
    skipped = {m: [lab for lab, cols in zip(labels, columns) if m in cols] for m in seen if m not in shared}
    return shared, skipped


def seed_groups(results: list[RunResult]) -> list[tuple[str, list[RunResult]]] | None:
    """The runs grouped by the config values that tell them apart, the seed aside (a sweep's configurations over
    its seeds), each group named by them; None unless some group holds several runs."""
    labels = _values_apart(results, {"name", "seed"})
    if labels is None:
        return None
    groups: dict[str, list[RunResult]] = {}
    for r, label in zip(results, labels):
        groups.setdefault(label or "all runs", []).append(r)
    return list(groups.items()) if any(len(g) > 1 for g in groups.values()) else None


def overlay_figure(metric: str, results: list[RunResult], labels: list[str],
                   groups: list[tuple[str, list[RunResult]]] | None = None):
    """`metric` against round, simulated time and Γ, one line per run, a shared legend below; with `groups`, one
    line per group: at each round the mean over its runs of the metric and of each axis, and a band of ± one std."""
    fig, axes = plt.subplots(1, len(AXES), figsize=(4.4 * len(AXES), 3.6), squeeze=False)
    values = []
    for label, runs in groups or [(label, [result]) for result, label in zip(results, labels)]:
        frame = pd.concat([r.rounds[[x for x, _ in AXES] + [metric]].dropna(subset=[metric]) for r in runs])
        by_round = frame.groupby("round", sort=True)
        mean = by_round.mean().reset_index()
        name = label if len(runs) == 1 else f"{label} (mean ± std of {len(runs)})"
        for ax, (x, _) in zip(axes[0], AXES):
            line, = ax.plot(mean[x], mean[metric], marker="." if len(mean) < 40 else None, linewidth=1.2, label=name)
            if len(runs) > 1:
                std = by_round[metric].std(ddof=0).to_numpy()
                ax.fill_between(mean[x], mean[metric] - std, mean[metric] + std, color=line.get_color(), alpha=0.2,
                                linewidth=0)
        values.append(frame[metric])
    log = wants_log(pd.concat(values))
    for ax, (_, name) in zip(axes[0], AXES):
        ax.set_xlabel(name)
        tidy_x(ax)
        ax.set_ylabel(metric + (" (log scale)" if log else ""))
        ax.set_yscale("log" if log else "linear")
        ax.grid(alpha=0.3, which="both" if log else "major")
    fig.suptitle(f"{metric}: {len(results)} runs" + (f" in {len(groups)} configurations" if groups else ""))
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
    make_dir(out)
    legends, groups = legend_labels(results), seed_groups(results)
    written = [save_figure(overlay_figure(m, results, legends, groups), out / f"compare_{m}.png", legend_outside=True)
               for m in shared]
    return written, skipped
