"""Hyperparameter sweeps with Ray Tune: the up-front validation of the `sweep:` section, and `run_sweep`,
which runs a new sweep or resumes an interrupted one; every trial is one simulation whose actors sit in
the trial's placement group (raysim.sweep.trial).

The schema lives in raysim.config.sweep, the search in raysim.sweep.search, the result tables in
raysim.sweep.results; Ray Tune, which is slow to import, is imported inside the functions.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from raysim.config.sweep import SweepConfig
from raysim.results import new_run_dir
from raysim.storage.atomic import write_text
from raysim.sweep.results import SweepResult, collect
from raysim.sweep.search import check_search, param_space, search_algorithm
from raysim.sweep.trial import placement, run_trial, trial_resources

if TYPE_CHECKING:
    from raysim.config import ExperimentConfig


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
        points = domain.points(rng)
        bad: dict[str, list[Any]] = {}  # each problem, with the values that have it
        for value in points:
            try:
                configs.append(load_config(tree, {key: value}))
            except ConfigError as e:
                bad.setdefault("; ".join(e.problems), []).append(value)
        for problem, values in bad.items():  # a problem of every value (an unknown field) is one line, not one a value
            listed = ("values " if len(values) > 1 else "value ") + ", ".join(map(repr, values))
            which = "every value" if len(values) == len(points) > 1 else listed
            problems.append(f"sweep.space.{key}: {which} is invalid: {problem}")
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


def _trial_dirname(trial: Any) -> str:
    """Trial directories named by trial id, so a trial finds its own from `tune.get_context()`."""
    return trial.trial_id


def _sweep_dir(resume: str | Path) -> Path:
    """The directory of the sweep to resume, checked to be one (a RunDirError otherwise)."""
    from ray import tune

    from raysim.errors import RunDirError

    sweep_dir = Path(resume).resolve()
    if not sweep_dir.is_dir():
        raise RunDirError(f"--resume: {sweep_dir} does not exist")
    if not (sweep_dir / "config.yaml").exists() or not tune.Tuner.can_restore(sweep_dir):
        raise RunDirError(f"--resume: {sweep_dir} is not a raysim sweep directory (it needs config.yaml and"
                          " Ray Tune's tuner.pkl)")
    return sweep_dir


def run_sweep(config: str | Path | dict | None, overrides: list[str] | dict | None = None, *,
              address: str | None = None, out: str | Path | None = None, resume: str | Path | None = None,
              verbose: int = 1) -> SweepResult:
    """Validate the `sweep:` section, run its Ray Tune search, write `sweep_results.parquet` (and with
    seeds > 1 `sweep_configs.parquet`).

    Each trial reserves `tune.PlacementGroupFactory([server_bundle, *client_bundles])` and Tune
    captures the trial's child actors in it, so concurrent trials cannot starve each other.
    `resume=SWEEP_DIR` continues an interrupted sweep with the config saved there (`config` is then
    ignored and may be None) through Tune's `Tuner.restore`: trials that had finished are not run again,
    unfinished ones continue from their run's newest checkpoint.
    """
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, TrialScheduler

    from raysim import plugins
    from raysim.config import dump_config, load_config
    from raysim.errors import ConfigError
    from raysim.runner import ensure_ray

    sweep_dir = _sweep_dir(resume) if resume is not None else None
    if sweep_dir is not None:
        cfg = load_config(sweep_dir / "config.yaml")
    elif config is None:
        raise ConfigError("sweep: give the experiment's config, or resume=SWEEP_DIR (raysim sweep --resume DIR)")
    else:
        cfg = load_config(config, overrides)
    if cfg.sweep is None:
        raise ConfigError("sweep: the experiment has no sweep section (space:, metric:, mode:, ...)")
    sweep = cfg.sweep
    points = check_space(cfg)
    check_search(sweep)
    longest = max(p.algorithm.rounds for p in points)
    if sweep.scheduler.kind == "asha" and sweep.scheduler.grace_period > longest:
        raise ConfigError(f"sweep.scheduler.grace_period: {sweep.scheduler.grace_period} rounds before ASHA may stop a"
                          f" trial, but the longest trial runs {longest} (algorithm.rounds)")
    # trials keep the sweep's working directory, so relative paths (data.path) mean what `raysim run` reads
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    # every round is reported, the metric only on evaluated ones (the trial checks it is there)
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # Tune's experiment state (trials, searcher) saved at least every second, for --resume
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    started = ensure_ray(cfg, address)
    try:
        cpus, gpus = trial_budget(sweep, points, ray.cluster_resources())
        if sweep_dir is None:
            sweep_dir = Path(out) if out is not None else new_run_dir(cfg.name, Path(sweep.storage_path))
            sweep_dir = sweep_dir.resolve()
            sweep_dir.mkdir(parents=True, exist_ok=True)
            write_text(dump_config(cfg), sweep_dir / "config.yaml")
        tree = base_tree(cfg)
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, tree=tree, sweep_dir=str(sweep_dir), cpus=cpus, gpus=gpus,
                                 metric=sweep.metric, mode=sweep.mode, registrations=plugins.snapshot()),
            functools.partial(placement, tree, cpus, gpus))
        if resume is not None:
            tuner = tune.Tuner.restore(str(sweep_dir), trainable)
        else:
            scheduler: TrialScheduler
            if sweep.scheduler.kind == "asha":
                scheduler = ASHAScheduler(time_attr="round", max_t=max(p.algorithm.rounds for p in points),
                                          grace_period=sweep.scheduler.grace_period,
                                          reduction_factor=sweep.scheduler.reduction_factor)
            else:
                scheduler = FIFOScheduler()
            search, samples, concurrency = search_algorithm(sweep, cfg.seed)
            tuner = tune.Tuner(
                trainable, param_space=param_space(sweep),
                tune_config=tune.TuneConfig(metric=sweep.metric, mode=sweep.mode, scheduler=scheduler,
                                            search_alg=search, num_samples=samples,
                                            max_concurrent_trials=concurrency, trial_dirname_creator=_trial_dirname),
                run_config=tune.RunConfig(storage_path=str(sweep_dir.parent), name=sweep_dir.name, verbose=verbose),
            )
        grid = tuner.fit()
    finally:
        if started:
            ray.shutdown()
    return collect(grid, sweep_dir, sweep, cfg.seed)
