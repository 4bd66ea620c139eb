"""Callbacks that log a run to an experiment tracker: Weights & Biases (offline files) and MLflow (a local
store by default). Each logs the run's config once and every numeric round column with step = round."""
from __future__ import annotations

import importlib.util
import os
import time
from typing import Any
from urllib.parse import urlparse

import yaml

from raysim.callbacks.base import Callback, RunContext, ServerView
from raysim.callbacks.writers import scalars
from raysim.core.distribution import needs_extra
from raysim.errors import ConfigError


def missing_extra(module: str, extra: str) -> str | None:
    """Why `module` cannot be used (the extra to install, in one line), or None when it imports."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        found = False
    return None if found else needs_extra(f"kind {extra}", extra)


def require_extra(module: str, extra: str) -> None:
    """A one-line ConfigError naming the extra to install when `module` is missing."""
    problem = missing_extra(module, extra)
    if problem is not None:
        raise ConfigError(f"callbacks: {problem}")


def config_tree(run: RunContext) -> dict[str, Any]:
    """The run's resolved config as saved in RUN/config.yaml (defaults filled in)."""
    return yaml.safe_load((run.run_dir / "config.yaml").read_text())


UNTRACKED = ("cluster", "checkpoint", "callbacks", "sweep", "plugins", "command", "backend", "faults",
             "data.client_rows", "algorithm.vectorize")  # where and how it runs, not what: the same numbers
# a field logged only when the field it depends on has one of these values (the rest are the unused parts' defaults)
WHEN = {
    "data.synthetic_": ("data.source", ("synthetic",)),
    "data.mnist1d_": ("data.source", ("mnist1d",)),
    "data.label_column": ("data.source", ("parquet",)),
    "data.client_column": ("data.source", ("parquet",)),
    "algorithm.levels": ("algorithm.quantizer", ("qsgd",)),
    "algorithm.local_optimizer.betas": ("algorithm.local_optimizer.kind", ("adam",)),
    "algorithm.local_optimizer.eps": ("algorithm.local_optimizer.kind", ("adam",)),
    "data.partition.alpha": ("data.partition.kind", ("dirichlet", "dirichlet_classes")),
    "data.partition.shards_per_client": ("data.partition.kind", ("shards",)),
    "data.partition.quantity_sigma": ("data.partition.kind", ("quantity",)),
    "model.hidden": ("model.name", ("mlp",)),
    "model.channels": ("model.name", ("cnn",)),
    "system.comm.nu": ("system.comm.mode", ("explicit",)),
    "system.compute.speed_sigma": ("system.compute.speed", ("lognormal",)),
    "system.compute.speed_factor": ("system.compute.speed", ("constant",)),
    "system.clock.time_scale": ("system.clock.mode", ("real",)),
    "system.availability.p": ("system.availability.kind", ("bernoulli",)),
    "system.availability.mean_": ("system.availability.kind", ("markov",)),
    "system.availability.period": ("system.availability.kind", ("diurnal",)),
    "system.availability.on_fraction": ("system.availability.kind", ("diurnal",)),
    "schedule.alpha": ("schedule.kind", ("async",)),
}


def tracked(tree: dict[str, Any]) -> dict[str, Any]:
    """The params a tracker logs, by dotted key: the config's fields that decide the run's numbers, without the
    layout and bookkeeping sections (UNTRACKED), unset fields, or the settings of parts the run does not use (WHEN)."""
    params = flat(tree)
    return {k: v for k, v in params.items() if v is not None and v != [] and v != {} and not k.startswith(UNTRACKED)
            and all(params.get(on) in values for prefix, (on, values) in WHEN.items() if k.startswith(prefix))}


def flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted.key: value}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat(value, name + "."))
        else:
            out[name] = value
    return out


class Wandb(Callback):
    """Logs to Weights & Biases in offline mode: files under `RUN/wandb/` (upload later with `wandb sync
    RUN/wandb/offline-run-*`); the config as the run's config, each round's numbers at step = round."""

    def __init__(self, project: str = "raysim", name: str | None = None):
        self.project, self.name = project, name
        self.run: Any = None  # a wandb Run once started (wandb is an optional extra)

    def on_run_start(self, run: RunContext) -> None:
        require_extra("wandb", "wandb")
        import wandb

        self.run = wandb.init(mode="offline", dir=str(run.run_dir), project=self.project,
                              name=self.name or run.run_dir.name, config=tracked(config_tree(run)),
                              settings=wandb.Settings(console="off"))  # leave stdout/stderr (the progress) unwrapped

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        self.run.log(scalars(row), step=row["round"])
        return None

    def on_run_end(self, run: RunContext, status: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if status in ("finished", "stopped") else 1)


class Mlflow(Callback):
    """Logs to MLflow: the config as params (dotted keys), each round's numbers as metrics at step = round,
    and the run's end as status FINISHED (also when a callback stopped it) or FAILED. The default store is
    the file store `RUN/mlruns` (`mlflow ui --backend-store-uri RUN/mlruns`); `tracking_uri` takes any other."""

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None, run_name: str | None = None):
        self.tracking_uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.client: Any = None  # an MlflowClient once started (mlflow is an optional extra)
        self.run_id: str | None = None

    def on_run_start(self, run: RunContext) -> None:
        require_extra("mlflow", "mlflow")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = self.tracking_uri or (run.run_dir / "mlruns").resolve().as_uri()
        if urlparse(uri).scheme in ("", "file"):  # MLflow 3 keeps the file store only behind this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(uri)
        name = self.experiment or run.cfg.name
        found = self.client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found is not None else self.client.create_experiment(name)
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_name or run.run_dir.name,
                                             tags={"raysim.run_dir": str(run.run_dir.resolve())}).info.run_id
        params = [Param(k, str(v)) for k, v in tracked(config_tree(run)).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def on_round_end(self, row: dict, server: ServerView) -> bool | None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, row["round"]) for k, v in scalars(row).items()])
        return None

    def on_run_end(self, run: RunContext, status: str) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, {"failed": "FAILED", "interrupted": "KILLED"}.get(status, "FINISHED"))

