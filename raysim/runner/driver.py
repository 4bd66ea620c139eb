"""Run an experiment: build the federated data, start (or join) Ray and the server and client actors
(or, with `backend: local`, the same engine in this process), drive the rounds, write results after
every round, and stop cleanly on errors."""
from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import ray

from raysim.callbacks import Callback, RoundCallback, RunContext, ServerView, build_callbacks
from raysim.config import ExperimentConfig, dump_config, load_config, parse_override
from raysim.data import build_federated, check_source
from raysim.errors import (ClusterError, ConfigError, DivergenceError, RunDirError, RunInterrupted, UserError,
                           first_line)
from raysim.results import RunResult, RunWriter, new_run_dir
from raysim.results.export import save_federated
from raysim.round.experiment import Experiment, check_on
from raysim.round.local import LocalServer
from raysim.runner import ray_session
from raysim.runner.interrupt import StopSignals
from raysim.runner.progress import LOGGER, RunProgress, configure_logging
from raysim.storage import checkpoint
from raysim.storage.atomic import make_dir, write_text


def ensure_ray(cfg: ExperimentConfig, address: str | None) -> bool:
    """Connect to `address` (or the config's), or start a local Ray; True if this call started it. An address that
    is malformed or answers nothing is the user's to fix (ClusterError), not a defect."""
    where = address or cfg.cluster.address
    try:
        return ray_session.ensure(where, cfg.cluster.num_cpus)
    except (ValueError, ConnectionError) as e:
        if not where:
            raise
        flag = "--address" if address else "cluster.address"
        raise ClusterError(f"{flag} {where}: cannot join Ray there ({first_line(e)})") from e


def server_in_driver(cfg: ExperimentConfig, address: str | None) -> bool:
    """Whether a Ray run's server is this process (`cluster.server: driver`) or an actor (`actor`; `auto`
    picks it for a Ray Client address)."""
    where = cfg.cluster.server
    return where == "driver" or (where == "auto" and not (address or "").startswith("ray://"))


def ray_server(experiment: Experiment, data: dict, run_dir: Path, address: str | None, fleet: Any = None):
    """The server of a Ray run: in this process, with the client actors `fleet` if they were launched
    already, or as an actor behind the calls of `raysim.round.local.LocalServer`."""
    from raysim.actors.server import RoundServer

    if server_in_driver(experiment.cfg, address):
        return RoundServer(experiment, data, str(run_dir), fleet)
    return RemoteServer(experiment, data, run_dir)


class RemoteServer:
    """The server actor behind the calls of `raysim.round.local.LocalServer`."""

    def __init__(self, experiment: Experiment, data: dict, run_dir: Path):
        from raysim.actors.server import ServerActor

        # Any: Ray types an actor handle's methods only when they are declared with @ray.method
        self.actor: Any = ServerActor.remote(experiment, data, str(run_dir))

    def start(self) -> dict:
        return ray.get(self.actor.start.remote())

    def resume(self, folder: str) -> None:
        ray.get(self.actor.resume.remote(folder))

    def checkpoint(self, round: int) -> None:
        ray.get(self.actor.checkpoint.remote(round))

    def run_round(self, round: int) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        return ray.get(self.actor.run_round.remote(round))

    def state(self) -> Any:
        return ray.get(self.actor.state.remote())

    def close(self) -> None:
        if ray.is_initialized():
            ray.kill(self.actor)  # its client actors go with it (it owns them)


def _layout_line(layout: dict) -> str:
    """Where the clients are, in words, for the log."""
    actors, per = layout.get("actors", 0), layout.get("clients_per_actor")
    if layout.get("backend") == "local":
        return "none, every client in this process (backend: local)"
    here = " and this process" if layout.get("driver_shard") else ""
    return f"{actors} client actor{'s' if actors != 1 else ''}{here}, {per} clients each"


def _check_finite(row: dict) -> None:
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise DivergenceError(f"round {row['round']}: {', '.join(bad)} became non-finite (NaN/inf); "
                              "the run diverged (try a smaller algorithm.lr). Finished rounds are saved.")


RUNS_ROOT = Path("runs")  # where a run without --out goes, relative to the working directory


def _first_new_parent(path: Path) -> Path | None:
    """The outermost directory that creating `path` would make (None: `path` exists already)."""
    new = None
    for p in [path, *path.parents]:
        if p.exists():
            return new
        new = p
    return new


RUN_FILES = ("config.yaml", "run.json", "rounds.parquet", "clients.parquet", "checkpoints")  # any one: a run directory


def claim_out(run_dir: Path, overwrite: bool = False) -> Path | None:
    """Make `--out` ready for a new run and return the outermost directory this made (None: it existed). A
    directory holding a run is refused unless `overwrite` (then its contents go first); so is any other
    non-empty directory, or a path that is a file or cannot be made: results are never mixed."""
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if not any((run_dir / name).exists() for name in RUN_FILES):
            raise RunDirError(f"--out {run_dir}: not empty and holds no raysim run; give a new or empty directory")
        if not overwrite:
            raise RunDirError(f"--out {run_dir} already holds a run: `--resume {run_dir}` continues it, "
                              "`--overwrite` replaces it")
        shutil.rmtree(run_dir)
    created = _first_new_parent(run_dir)
    make_dir(run_dir)
    return created


def _resume_point(run_dir: Path) -> int:
    """The round an interrupted run continues after: its newest intact checkpoint that its tables reach
    (0: none was taken); a damaged table or no intact checkpoint is a RunDirError, with nothing changed."""
    reached = checkpoint.tables_reach(run_dir) or 0
    found = checkpoint.latest(run_dir, reached)
    return found[0] if found else 0


def run(config: str | Path | dict[str, Any] | ExperimentConfig | None, overrides: list[str] | dict[str, Any] | None = None,
        *, address: str | None = None, out: str | Path | None = None, progress: bool = True,
        on_round: Callable[[dict[str, Any]], bool | None] | None = None, resume: str | Path | None = None,
        callbacks: list[Callback] | None = None, overwrite: bool = False, **kw_overrides: Any) -> RunResult:
    """Run one experiment and return its results (`.rounds`, `.clients` DataFrames, `.run_dir`).

    `overrides` are `key.sub=value` strings or a {dotted key: value} mapping; keyword arguments
    with `__` for dots work too (`algorithm__lr=0.1`). `callbacks` (raysim.callbacks.Callback objects)
    run after the config's own `callbacks:`; `on_round(row)` is the simplest one, called after each
    round is saved (e.g. to report to Ray Tune). A callback returning False stops the run after that
    round (status "stopped", its last round checkpointed).
    `out` must be new or empty; `overwrite=True` replaces a run already there.
    `resume=RUN_DIR` continues an interrupted run from its newest intact checkpoint with the config saved
    there (`config` is then ignored and may be None) and reaches the same numbers as an uninterrupted run.
    SIGTERM or SIGINT stops the run after the round in flight, with a checkpoint, and raises RunInterrupted.
    `progress` shows the start-up and the rounds on stderr (a bar on a terminal or in Jupyter, plain lines every
    10 s otherwise), through the `raysim` logger: when neither it nor the root logger has a handler yet (a plain
    script or notebook), one to stderr is added; a program that configured logging keeps its own.
    """
    if progress and not LOGGER.handlers and not logging.getLogger().handlers:
        configure_logging()
    items = dict(overrides or {}) if not isinstance(overrides, list) else dict(map(parse_override, overrides))
    items.update({k.replace("__", "."): v for k, v in kw_overrides.items()})
    with StopSignals() as signals:
        if resume is not None:
            run_dir = Path(resume)
            if not (run_dir / "config.yaml").exists():
                what = "does not exist" if not run_dir.exists() else "has no config.yaml"
                raise RunDirError(f"--resume: {run_dir} {what}: not a raysim run directory")
            cfg = load_config(run_dir / "config.yaml", items)
            done = _resume_point(run_dir)
        elif config is None:
            raise ConfigError("no config given: pass a YAML path, a dict or an ExperimentConfig (None only with resume=)")
        else:
            done, cfg = 0, load_config(config, items)
        experiment = Experiment.of(cfg)
        check_source(cfg.data)  # a missing file or column is reported before anything is made or Ray starts
        if resume is not None:
            created = None
        elif out is not None:
            run_dir = Path(out)
            created = claim_out(run_dir, overwrite)
        else:  # new_run_dir makes runs/<name>-<time>/ (and runs/ when it is new)
            created = _first_new_parent(RUNS_ROOT)
            run_dir = new_run_dir(cfg.name, RUNS_ROOT)
            created = created or run_dir
        return _run(experiment, run_dir, created, done, resume is not None, address, progress,
                    [*build_callbacks(cfg.callbacks), *(callbacks or []), *([RoundCallback(on_round)] if on_round else [])],
                    signals)


def _run(experiment: Experiment, run_dir: Path, created: Path | None, done: int, resumed: bool, address: str | None,
         progress: bool, hooks: list[Callback], signals: StopSignals) -> RunResult:
    """`run` once the input is checked and the run directory claimed: start, drive the rounds, stop cleanly."""
    cfg = experiment.cfg
    write_text(dump_config(cfg), run_dir / "config.yaml")
    writer = RunWriter(run_dir, resume_round=done if resumed else None)
    t_start = time.perf_counter()
    started_ray = False
    server = fleet = None
    ctx = RunContext(run_dir, cfg, done)
    started: list[Callback] = []
    status = "failed"
    try:
        where = address or cfg.cluster.address
        if cfg.backend == "ray":  # Ray, then the client actors, first: their processes boot while the data are built
            started_ray = ensure_ray(cfg, address)
            signals.install()  # ray.init sets a SIGTERM handler of its own
            if server_in_driver(cfg, where):
                from raysim.actors.server import launch

                fleet = launch(experiment)
        t_ray = time.perf_counter()
        fed = build_federated(cfg.data, cfg.seed, run_dir / "data")
        save_federated(fed, run_dir / "data")
        check_on(experiment, fed)  # before any line is logged: a mistake the data reveal stays the only line
        LOGGER.info("%s: %s", cfg.name, f"resuming {run_dir} after round {done}" if resumed else f"writing {run_dir}")
        t_data = time.perf_counter()
        local = fed.local_test()
        LOGGER.info("data: %d clients, %d training%s and %d test samples (%.1f s)", fed.num_clients, fed.num_train,
                    "" if local is None else f", {local.num_train} local test", fed.num_test, t_data - t_ray)
        for key, value in fed.description.items():  # how the source read its file (-v), also in data/federated.json
            LOGGER.debug("data: %s %s", key, value)
        if cfg.backend == "ray":  # logged after the data: a mistake in them stays the only line
            LOGGER.info("ray: %s (%.1f s)", "started" if started_ray else "connected", t_ray - t_start)
        server = (ray_server(experiment, fed.to_dict(), run_dir, where, fleet) if cfg.backend == "ray"
                  else LocalServer(experiment, fed.to_dict(), run_dir))
        fleet = None  # the server owns the actors now
        layout = server.start()
        LOGGER.info("actors: %s (%.1f s)", _layout_line(layout), time.perf_counter() - t_data)
        if done:
            server.resume(str(checkpoint.checkpoint_dir(run_dir, done)))
        writer.status(data_s=t_data - t_ray, ray_s=t_ray - t_start,
                      startup_s=time.perf_counter() - t_start, resumed_from=done, **layout)
        for cb in hooks:
            cb.on_run_start(ctx)
            started.append(cb)
        view = ServerView(server.state)
        wall = writer.rounds[-1]["wall_s"] if writer.rounds else 0.0
        stopped_by: list[str] = []
        with RunProgress(cfg.name, cfg.algorithm.rounds, done, progress) as bar:
            signals.at_round_end = True
            for t in range(done + 1, cfg.algorithm.rounds + 1):
                t0 = time.perf_counter()
                row, client_rows, evals = server.run_round(t)
                wall += time.perf_counter() - t0
                row["wall_s"] = wall
                writer.add(row, client_rows, evals)
                if row["checkpoint"]:  # a resume restarts after this round: its rows go to disk first
                    writer.flush()
                    checkpoint.commit(run_dir, t)
                _check_finite(row)
                votes = [cb.on_round_end(row, view) for cb in hooks]
                stopped_by = [type(cb).__name__ for cb, v in zip(hooks, votes) if v is False]
                bar.update(row)
                if stopped_by or signals.received:
                    break
        last = len(writer.rounds)
        if not signals.received:  # first: a Tune trial that its scheduler stopped may be ended during the checkpoint
            status = "stopped" if last < cfg.algorithm.rounds else "finished"
            writer.status(status=status, rounds_done=last, **({"stopped_by": stopped_by} if stopped_by else {}))
        if last < cfg.algorithm.rounds and last and not writer.rounds[-1]["checkpoint"] and cfg.checkpoint.every > 0:
            server.checkpoint(last)  # the last round trained is what export, trained_model and --resume start from
            writer.flush()
            checkpoint.commit(run_dir, last)
        signals.at_round_end = False
        if signals.received:
            raise RunInterrupted(signals.received)
        if stopped_by:
            LOGGER.info("stopped after round %d by %s", last, ", ".join(stopped_by))
    except BaseException as e:
        if isinstance(e, RunInterrupted):
            status = "interrupted"
            writer.status(status=status, rounds_done=len(writer.rounds), signal=e.name)
            e = RunInterrupted(e.signum, run_dir, len(writer.rounds))
        elif isinstance(e, UserError) and created is not None and not writer.rounds:
            shutil.rmtree(created, ignore_errors=True)  # a mistake in the input and nothing ran: leave no directory
        else:
            writer.status(status="failed", rounds_done=len(writer.rounds), error=f"{type(e).__name__}: {e}")
        raise e
    finally:
        for cb in started:
            cb.on_run_end(ctx, status)
        if server is not None:
            server.close()
        if fleet is not None:  # launched, then the data failed
            fleet.close()
        if started_ray:
            ray.shutdown()
    return RunResult.load(run_dir)
