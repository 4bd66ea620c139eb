"""The tables of a finished sweep: one row per trial (`sweep_results.parquet`), one row per configuration
over its seeds (`sweep_configs.parquet`, when `sweep.seeds` > 1), the best of them, and their rich table."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.config.sweep import SweepConfig
from raysim.results import RunResult
from raysim.storage.atomic import write_parquet
from raysim.sweep.trial import trial_run_dir, trial_seed

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table

NOT_AGGREGATED = ("trial_id", "seed", "status", "error", "run_dir")


@dataclass
class SweepResult:
    """A finished sweep: its directory, one row per trial (config values, seed, final and best metric,
    status), with seeds > 1 one row per configuration (`configs`), and the best trial or configuration."""

    sweep_dir: Path
    trials: pd.DataFrame
    keys: list[str]
    metric: str
    mode: str
    configs: pd.DataFrame | None = None
    best: pd.Series | None = None


def trial_row(result: Any, sweep_dir: Path, keys: list[str], metric: str, mode: str, base_seed: int) -> dict:
    """One row of sweep_results.parquet, read from the trial's own run directory (its run.json status:
    finished, stopped by the scheduler, failed) and Tune's error for trials that never wrote one."""
    import pandas as pd

    trial_id = result.metrics["trial_id"]  # Tune's directory may carry a suffix (raysim.sweep.trial.trial_run_dir)
    run_dir = trial_run_dir(sweep_dir, trial_id)
    row: dict[str, Any] = {"trial_id": trial_id, **{k: result.config.get(k) for k in keys},
                           "seed": trial_seed(result.config, base_seed)}
    try:
        run = RunResult.load(run_dir)
    except FileNotFoundError:
        run = None
    if run is not None and len(run.rounds):
        last = run.rounds.iloc[-1]
        row["rounds_done"] = int(last["round"])
        row.update({k: float(v) for k, v in last.items() if k != "round" and isinstance(v, (int, float, np.number))})
        values = run.rounds[metric] if metric in run.rounds else pd.Series(dtype=float)
        row[f"best_{metric}"] = float(values.max() if mode == "max" else values.min())
    else:
        row["rounds_done"] = 0
    row["status"] = "failed" if result.error or run is None else run.info.get("status", "failed")
    row["error"] = None if result.error is None else f"{type(result.error).__name__}: {result.error}"
    row["run_dir"] = str(run_dir)
    return row


def config_rows(trials: pd.DataFrame, keys: list[str]) -> list[dict]:
    """One row per configuration (equal values of `keys`): its trial ids, `seeds` (distinct seeds of runs
    that did not fail; runs are deterministic, so a repeated seed adds nothing), `failed`, and the mean
    and sample standard deviation (ddof 1; NaN for one seed) of every final number over those runs."""
    numbers = [c for c in trials.select_dtypes("number").columns if c not in (*keys, *NOT_AGGREGATED)]
    groups: dict[str, list[int]] = {}
    for i, values in enumerate(trials[keys].itertuples(index=False)):
        groups.setdefault(json.dumps(list(values), default=str), []).append(i)
    rows = []
    for members in groups.values():
        group = trials.iloc[members]
        ok = group[group["status"] != "failed"].drop_duplicates("seed")
        row = {**{k: group[k].iloc[0] for k in keys}, "trial_ids": list(group["trial_id"]),
               "seeds": len(ok), "failed": int((group["status"] == "failed").sum())}
        for c in numbers:
            row[f"{c}_mean"], row[f"{c}_std"] = float(ok[c].mean()), float(ok[c].std(ddof=1))
        rows.append(row)
    return rows


def collect(grid: Any, sweep_dir: Path, sweep: SweepConfig, base_seed: int) -> SweepResult:
    """Write `sweep_results.parquet` (and with seeds > 1 `sweep_configs.parquet`) for Tune's ResultGrid."""
    import pandas as pd

    keys = list(sweep.space)
    trials = pd.DataFrame([trial_row(r, sweep_dir, keys, sweep.metric, sweep.mode, base_seed) for r in grid])
    write_parquet(trials.to_dict("records"), sweep_dir / "sweep_results.parquet")
    if sweep.seeds == 1:
        return SweepResult(sweep_dir, trials, keys, sweep.metric, sweep.mode,
                           best=best(trials, sweep.metric, sweep.mode))
    rows = config_rows(trials, keys)
    write_parquet(rows, sweep_dir / "sweep_configs.parquet")
    configs = pd.DataFrame(rows)
    return SweepResult(sweep_dir, trials, keys, sweep.metric, sweep.mode, configs,
                       best(configs, f"{sweep.metric}_mean", sweep.mode))


def best(table: pd.DataFrame, metric: str, mode: str) -> pd.Series | None:
    """The row whose `metric` is best (for trials: the last reported value, Tune's scope "last"), among
    trials that did not fail or configurations with a seed that did not."""
    if metric not in table:
        return None
    ok = table[table["status"] != "failed"] if "status" in table else table[table["seeds"] > 0]
    ok = ok[ok[metric].notna()]
    if ok.empty:
        return None
    return ok.loc[ok[metric].idxmax() if mode == "max" else ok[metric].idxmin()]


def trial_dirs(sweep_dir: Path) -> list[Path]:
    """The run directories of a finished sweep's trials that wrote one, in the order of sweep_results.parquet."""
    import pandas as pd

    dirs = pd.read_parquet(sweep_dir / "sweep_results.parquet")["run_dir"].dropna()
    return [Path(d) for d in dirs if (Path(d) / "rounds.parquet").exists()]


def summary_table(result: SweepResult, width: int = 160) -> Table:
    """The trials (or with seeds, the configurations: mean ± std) as a rich table, best first, with the best one
    and its metrics in the caption. Headers are the swept keys' shortest distinct names (the full ones in the
    caption) and no cell is cut: where the columns do not fit in `width` characters (an 80-column terminal), each
    row becomes one cell of `name=value` words that wraps between them."""
    from rich.table import Column, Table

    m, by_config = result.metric, result.configs is not None
    rows = result.configs if result.configs is not None else result.trials
    rank = f"{m}_mean" if by_config else m
    names = short_names(result.keys)
    head = ["seeds"] if by_config else ["trial", "status"]
    heads = [*head, *names.values(), "rounds", m, "best", "sim_time"]
    order = rows.sort_values(rank, ascending=result.mode == "min", na_position="last") if rank in rows else rows
    cells, styles = [], []
    for i, t in order.iterrows():
        styles.append("bold green" if result.best is not None and i == result.best.name else None)
        numbers = [_spread(t, c) if by_config else _fmt(t.get(c)) for c in ("rounds_done", m, f"best_{m}", "sim_time")]
        cells.append([*([str(t["seeds"])] if by_config else [t["trial_id"], t["status"]]),
                      *[_fmt(t[k]) for k in result.keys], *numbers])
    title = f"sweep {result.sweep_dir.name}: {m} ({result.mode})"
    widths = [max([len(h), *(len(r[j]) for r in cells)]) for j, h in enumerate(heads)]
    if sum(widths) + 3 * len(widths) + 1 <= width:
        table = Table(*(Column(h, no_wrap=True) for h in heads), title=title)
        for row, style in zip(cells, styles):
            table.add_row(*row, style=style)
    else:  # one row a line of words: `lr=0.1  mu=0.01  test_accuracy=0.87±0.01`
        table = Table(heads[0], "values", title=title)
        for row, style in zip(cells, styles):
            table.add_row(row[0], "  ".join(f"{h}={v.replace(' ± ', '±')}" for h, v in zip(heads[1:], row[1:])),
                          style=style)
    legend = [f"{n}: {k}" for k, n in names.items() if n != k]
    lines = [", ".join([*legend, f"best: the best {m} of any round"])]
    if result.best is None:
        lines.append("no trial reported the metric")
    else:
        b = result.best
        config = ", ".join(f"{k}={_fmt(b[k])}" for k in result.keys)
        shown = [c for c in (m, "test_accuracy", "test_loss", "train_loss", "sim_time", "gamma")
                 if (f"{c}_mean" if by_config else c) in b]
        what = f"{b['seeds']} seeds" if by_config else b["trial_id"]
        lines.append(f"best: {what}  {config}  ->  " + ", ".join(
            f"{c}={_spread(b, c) if by_config else _fmt(b[c])}" for c in dict.fromkeys(shown)))
    errors = result.trials["error"].dropna()
    if len(errors):
        lines.append(f"{len(errors)} failed, e.g. {errors.iloc[0]}")
    table.caption = "\n".join(lines)
    return table


def short_names(keys: list[str]) -> dict[str, str]:
    """Each dotted key's shortest trailing part that no other key ends with (`algorithm.lr` -> `lr`)."""
    parts = {k: k.split(".") for k in keys}
    out = {}
    for k, p in parts.items():
        for n in range(1, len(p) + 1):
            name = ".".join(p[-n:])
            if not any(o != k and (o == name or o.endswith("." + name)) for o in keys):
                break
        out[k] = name
    return out


def _spread(row: pd.Series, column: str) -> str:
    """`mean ± std` of a configuration's column over its seeds."""
    return f"{_fmt(row.get(f'{column}_mean'))} ± {_fmt(row.get(f'{column}_std'))}"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return "-" if value is None else str(value)
