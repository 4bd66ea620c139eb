"""Hyperparameter sweeps with Ray Tune: the YAML `sweep:` section, its up-front validation, and
`run_sweep`, in which every trial is one simulation whose actors sit in the trial's placement group.

The schema lives in raysim.sweep_config; Ray Tune, which is slow to import, is imported inside the functions.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.results import RunResult, new_run_dir, write_parquet, write_text
from raysim.sweep_config import SweepConfig

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table

    from raysim.config import ExperimentConfig


@dataclass(frozen=True)
class TrialResources:
    """A trial's placement-group bundles and the `cluster.*` overrides that size its actors to them."""

    bundles: list[dict[str, float]]
    overrides: dict[str, Any]


def trial_resources(cfg: ExperimentConfig, cpus: float, gpus: float) -> TrialResources:
    """Bundles [server, *clients] for a trial of `cpus` CPUs and `gpus` GPUs, and the matching layout.

    The client actors follow `cfg.actor_layout` within the trial's CPUs; unless
    `cluster.cpus_per_actor` is set, the server and each client actor get an equal CPU share.
    The overrides pin `cluster.num_actors`/`cpus_per_actor`/`gpu_fraction`, so `Server.start`
    asks for exactly these bundles whatever the whole Ray cluster holds.
    """
    from raysim.actors.placement import client_resources
    from raysim.errors import ConfigError

    n_actors, _ = cfg.actor_layout(max(1, int(cpus)))
    share = cfg.cluster.cpus_per_actor or cpus / (n_actors + 1)
    r = client_resources(cfg.cluster.model_copy(update={"cpus_per_actor": share}), n_actors, cpus, gpus)
    server_cpus = math.floor((cpus - n_actors * r.num_cpus) * 10_000) / 10_000
    if server_cpus < 0:
        raise ConfigError(f"cluster.cpus_per_actor: {n_actors} client actors x {r.num_cpus} CPUs exceed"
                          f" sweep.trial_cpus={cpus:g}")
    client = {"CPU": r.num_cpus, **({"GPU": r.num_gpus} if r.num_gpus else {})}
    overrides = {"cluster.num_actors": n_actors, "cluster.cpus_per_actor": r.num_cpus,
                 "cluster.gpu_fraction": r.num_gpus or None}
    return TrialResources([{"CPU": server_cpus}, *[dict(client) for _ in range(n_actors)]], overrides)


def base_tree(cfg: ExperimentConfig) -> dict:
    """The experiment without its `sweep:` section: what every trial starts from."""
    tree = cfg.model_dump(mode="json")
    tree.pop("sweep", None)
    return tree


def check_space(cfg: ExperimentConfig) -> list[ExperimentConfig]:
    """One validated config per point of each dimension (every grid/choice value, both bounds and a
    draw of a range); a ConfigError names every bad key and value."""
    from raysim.config import load_config
    from raysim.errors import ConfigError

    assert cfg.sweep is not None, "check_space needs a sweep section"
    tree = base_tree(cfg)
    rng = np.random.default_rng(cfg.seed)
    configs, problems = [], []
    for key, domain in cfg.sweep.space.items():
        if key.split(".")[0] == "sweep":
            problems.append(f"sweep.space.{key}: the sweep section itself cannot be searched")
            continue
        for value in domain.points(rng):
            try:
                configs.append(load_config(tree, {key: value}))
            except ConfigError as e:
                problems.append(f"sweep.space.{key}: value {value!r} is invalid: {'; '.join(e.problems)}")
    if problems:
        raise ConfigError(problems)
    return configs


def trial_budget(sweep: SweepConfig, points: list[ExperimentConfig], total: dict[str, float]) -> tuple[float, float]:
    """(CPUs, GPUs) per trial on a cluster with `total` resources, checked against every point's layout."""
    from raysim.errors import ConfigError

    cluster_cpus, cluster_gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    cpus = sweep.trial_cpus or (cluster_cpus / sweep.concurrency if sweep.concurrency else 1.0)
    gpus = sweep.trial_gpus if sweep.trial_gpus is not None else cluster_gpus * cpus / max(cluster_cpus, 1.0)
    if cpus > cluster_cpus + 1e-9:
        raise ConfigError(f"sweep.trial_cpus: {cpus:g} exceeds the cluster's {cluster_cpus:g} CPUs")
    if (gpus > 0) != (cluster_gpus > 0) or gpus > cluster_gpus + 1e-9:
        raise ConfigError(f"sweep.trial_gpus: {gpus:g} does not fit the cluster's {cluster_gpus:g} GPUs"
                          " (client actors take a GPU share exactly when the cluster has GPUs)")
    for point in points:
        trial_resources(point, cpus, gpus)
    return cpus, gpus


@dataclass
class SweepResult:
    """A finished sweep: its directory and one row per trial (config values, final and best metric, status)."""

    sweep_dir: Path
    trials: pd.DataFrame
    keys: list[str]
    metric: str
    mode: str
    best: pd.Series | None = None


def _trial_dirname(trial: Any) -> str:
    """Trial directories named by trial id, so a trial finds its own from `tune.get_context()`."""
    return trial.trial_id


def _placement(tree: dict, cpus: float, gpus: float, params: dict) -> Any:
    """The trial's `tune.PlacementGroupFactory([server_bundle, *client_bundles])`."""
    from ray import tune

    from raysim.config import load_config

    return tune.PlacementGroupFactory(trial_resources(load_config(tree, params), cpus, gpus).bundles)


def _trial(params: dict, tree: dict, sweep_dir: str, cpus: float, gpus: float, metric: str,
           registrations: dict) -> None:
    """One Tune trial: one simulation in `<sweep_dir>/<trial_id>/run`, reporting every evaluated round.

    The driver's plugin registrations arrive by value and are installed before the config is read,
    so the trial needs none of the driver's files (another node may not have them)."""
    from ray import tune

    from raysim import plugins
    from raysim.config import load_config
    from raysim.runner import run

    plugins.install(registrations)
    tree = {**tree, "plugins": []}
    cfg = load_config(tree, params)

    def report(row: dict) -> bool:
        """Report to Tune; False (stop the run) when Tune stops the trial, which it signals by SystemExit(0)."""
        if metric not in row:
            if cfg.evaluates(row["round"]):
                raise ValueError(f"sweep.metric: {metric!r} is not in the results; "
                                 f"round {row['round']} has {sorted(row)}")
            return True
        try:
            tune.report(row)
        except SystemExit:
            return False
        return True

    run(tree, {**params, **trial_resources(cfg, cpus, gpus).overrides},
        out=Path(sweep_dir) / tune.get_context().get_trial_id() / "run", on_round=report)


def _trial_row(result: Any, keys: list[str], metric: str, mode: str) -> dict:
    """One row of sweep_results.parquet, read from the trial's own run directory (its run.json status:
    finished, stopped by the scheduler, failed) and Tune's error for trials that never wrote one."""
    import pandas as pd

    trial_dir = Path(result.path)
    row: dict[str, Any] = {"trial_id": trial_dir.name, **{k: result.config.get(k) for k in keys}}
    try:
        run = RunResult.load(trial_dir / "run")
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
    row["run_dir"] = str(trial_dir / "run")
    return row


def run_sweep(config: str | Path | dict, overrides: list[str] | dict | None = None, *,
              address: str | None = None, out: str | Path | None = None, verbose: int = 1) -> SweepResult:
    """Validate the `sweep:` section, run its Ray Tune search, write `sweep_results.parquet`.

    Each trial reserves `tune.PlacementGroupFactory([server_bundle, *client_bundles])` and Tune
    captures the trial's child actors in it, so concurrent trials cannot starve each other.
    """
    import pandas as pd
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

    from raysim import plugins
    from raysim.config import dump_config, load_config
    from raysim.errors import ConfigError
    from raysim.runner import ensure_ray

    cfg = load_config(config, overrides)
    if cfg.sweep is None:
        raise ConfigError("sweep: the experiment has no sweep section (space:, metric:, mode:, ...)")
    sweep = cfg.sweep
    points = check_space(cfg)
    started = ensure_ray(cfg, address)
    try:
        cpus, gpus = trial_budget(sweep, points, ray.cluster_resources())
        sweep_dir = Path(out) if out is not None else new_run_dir(cfg.name, Path(sweep.storage_path))
        sweep_dir = sweep_dir.resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        write_text(dump_config(cfg), sweep_dir / "config.yaml")
        tree = base_tree(cfg)
        keys = list(sweep.space)
        scheduler: TrialScheduler
        if sweep.scheduler.kind == "asha":
            scheduler = ASHAScheduler(time_attr="round", max_t=max(p.algorithm.rounds for p in points),
                                      grace_period=sweep.scheduler.grace_period,
                                      reduction_factor=sweep.scheduler.reduction_factor)
        else:
            scheduler = FIFOScheduler()
        # trials keep the sweep's working directory, so relative paths (data.path) mean what `raysim run` reads
        os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
        trainable = tune.with_parameters(_trial, tree=tree, sweep_dir=str(sweep_dir), cpus=cpus, gpus=gpus,
                                         metric=sweep.metric, registrations=plugins.snapshot())
        tuner = tune.Tuner(
            tune.with_resources(trainable, functools.partial(_placement, tree, cpus, gpus)),
            param_space={k: d.to_tune() for k, d in sweep.space.items()},
            tune_config=tune.TuneConfig(metric=sweep.metric, mode=sweep.mode, scheduler=scheduler,
                                        num_samples=sweep.num_samples, max_concurrent_trials=sweep.concurrency,
                                        trial_dirname_creator=_trial_dirname),
            run_config=tune.RunConfig(storage_path=str(sweep_dir.parent), name=sweep_dir.name, verbose=verbose),
        )
        grid = tuner.fit()
    finally:
        if started:
            ray.shutdown()
    trials = pd.DataFrame([_trial_row(grid[i], keys, sweep.metric, sweep.mode) for i in range(len(grid))])
    write_parquet(trials.to_dict("records"), sweep_dir / "sweep_results.parquet")
    return SweepResult(sweep_dir, trials, keys, sweep.metric, sweep.mode, _best(trials, sweep.metric, sweep.mode))


def _best(trials: pd.DataFrame, metric: str, mode: str) -> pd.Series | None:
    """The trial whose last reported `metric` is best (Tune's scope "last"), among those that did not fail."""
    if metric not in trials:
        return None
    ok = trials[(trials["status"] != "failed") & trials[metric].notna()]
    if ok.empty:
        return None
    return ok.loc[ok[metric].idxmax() if mode == "max" else ok[metric].idxmin()]


def summary_table(result: SweepResult) -> Table:
    """The trials as a rich table, best first, with the best config and its metrics in the caption."""
    from rich.table import Column, Table

    m = result.metric
    table = Table(Column("trial", no_wrap=True), "status", *result.keys, "rounds", m, f"best {m}", "sim_time",
                  title=f"sweep {result.sweep_dir.name}: {m} ({result.mode})")
    order = result.trials.sort_values(m, ascending=result.mode == "min", na_position="last") \
        if m in result.trials else result.trials
    for _, t in order.iterrows():
        style = "bold green" if result.best is not None and t["trial_id"] == result.best["trial_id"] else None
        table.add_row(t["trial_id"], t["status"], *[_fmt(t[k]) for k in result.keys], str(t["rounds_done"]),
                      _fmt(t.get(m)), _fmt(t.get(f"best_{m}")), _fmt(t.get("sim_time")), style=style)
    if result.best is None:
        lines = ["no trial reported the metric"]
    else:
        b = result.best
        config = ", ".join(f"{k}={_fmt(b[k])}" for k in result.keys)
        shown = dict.fromkeys((m, "test_accuracy", "test_loss", "train_loss", "sim_time", "gamma"))
        lines = [f"best: {b['trial_id']}  {config}  ->  " + ", ".join(f"{k}={_fmt(b[k])}" for k in shown if k in b)]
    errors = result.trials["error"].dropna()
    if len(errors):
        lines.append(f"{len(errors)} failed, e.g. {errors.iloc[0]}")
    table.caption = "\n".join(lines)
    return table


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    return "-" if value is None else str(value)
