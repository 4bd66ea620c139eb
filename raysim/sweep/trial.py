"""One Tune trial of a sweep: its placement-group bundles, the callback that reports every round to Tune,
and the trial function, which also continues its own run when an interrupted sweep is resumed.

Ray Tune, which is slow to import, is imported inside the functions.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysim.callbacks.metric import MetricWatch
from raysim.callbacks.writers import scalars
from raysim.results import RunResult

if TYPE_CHECKING:
    from raysim.callbacks.base import ServerView
    from raysim.config import ExperimentConfig

TRIAL_INDEX = "__trial_index__"  # ray.tune.search.repeater.TRIAL_INDEX: a trial's repeat, 0 .. sweep.seeds - 1


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


def trial_run_dir(sweep_dir: str | Path, trial_id: str) -> Path:
    """A trial's run: `<sweep>/<trial_id>/run`, keyed by the trial id, which a resumed sweep keeps. (Tune's own
    files of a trial it resumes without having saved its directory name go to `<trial_id>_<suffix>` instead.)"""
    return Path(sweep_dir) / trial_id / "run"


def trial_seed(params: dict, base_seed: int) -> int:
    """The seed of a trial: the experiment's (or the searched) seed plus the trial's repeat index."""
    return int(params.get("seed", base_seed)) + int(params.get(TRIAL_INDEX, 0))


def placement(tree: dict, cpus: float, gpus: float, params: dict) -> Any:
    """The trial's `tune.PlacementGroupFactory([server_bundle, *client_bundles])`."""
    from ray import tune

    from raysim.config import load_config

    space = {k: v for k, v in params.items() if k != TRIAL_INDEX}
    return tune.PlacementGroupFactory(trial_resources(load_config(tree, space), cpus, gpus).bundles)


def reported(row: dict, metric: str) -> dict:
    """What a round reports to Tune: the round, the sweep's metric, simulated time and Γ first (Tune's live table
    shows a result's first columns), then every other scalar of the row."""
    values = scalars(row)
    return {"round": int(row["round"]), **{k: values[k] for k in (metric, "sim_time", "gamma") if k in values}, **values}


class TuneReport(MetricWatch):
    """Reports the round and every scalar of its row (what a run's loggers see) to Tune each round, so
    Tune's schedulers, searchers and own loggers see them; an evaluated round must hold the sweep's metric.
    Stops the run (False) when Tune stops the trial, which Tune signals by SystemExit(0)."""

    def __init__(self, metric: str, mode: str):
        super().__init__(metric, mode, field="sweep")
        self.reported = 0

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        self.improved(row)
        return self.report(row)

    def report(self, row: dict) -> bool | None:
        from ray import tune

        self.reported += 1
        try:
            tune.report(reported(row, self.metric))
        except SystemExit:
            return False
        return None


def _done(run_dir: Path) -> bool:
    """Whether the run in `run_dir` ended by itself: finished, or stopped by one of its own callbacks
    (a run stopped through Tune may have been cut short by an interrupted sweep, and continues)."""
    path = run_dir / "run.json"
    info = json.loads(path.read_text()) if path.exists() else {}
    return info.get("status") == "finished" or (
        info.get("status") == "stopped" and TuneReport.__name__ not in info.get("stopped_by", [TuneReport.__name__]))


def run_trial(params: dict, tree: dict, sweep_dir: str, cpus: float, gpus: float, metric: str, mode: str,
              registrations: dict) -> None:
    """One Tune trial: one simulation in `<sweep_dir>/<trial_id>/run` with seed `trial_seed(params)`.

    The driver's plugin registrations arrive by value and are installed before the config is read,
    so the trial needs none of the driver's files (another node may not have them). In a resumed sweep
    an unfinished run continues from its newest checkpoint (`raysim run --resume`), and a run with no
    round left to run (it had ended, or its checkpoint is its last round) reports its last round again."""
    from ray import tune

    from raysim import plugins
    from raysim.config import load_config
    from raysim.runner import run

    plugins.install(registrations)
    tree = {**tree, "plugins": []}
    space = {k: v for k, v in params.items() if k != TRIAL_INDEX}
    cfg = load_config(tree, space)
    layout = trial_resources(cfg, cpus, gpus).overrides
    run_dir = trial_run_dir(sweep_dir, tune.get_context().get_trial_id())
    report = TuneReport(metric, mode)
    if (run_dir / "config.yaml").exists():
        if not _done(run_dir):
            run(None, layout, resume=run_dir, callbacks=[report], progress=False)
    else:
        run(tree, {**space, "seed": trial_seed(params, cfg.seed), **layout}, out=run_dir, callbacks=[report], progress=False)
    if not report.reported:
        report.report(RunResult.load(run_dir).rounds.iloc[-1].to_dict())
