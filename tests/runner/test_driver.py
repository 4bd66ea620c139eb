"""End-to-end runs: results on disk, failures that keep results, user algorithms on actors, resume after a kill."""
import json
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import ray

import raysim
from raysim import Algorithm, register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.errors import DivergenceError
from raysim.results import reproducible

SMALL = {
    "name": "small",
    "seed": 7,
    "data": {"source": "digits", "num_clients": 12, "partition": {"kind": "dirichlet", "alpha": 0.5}},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "fedavg", "rounds": 4, "clients_per_round": 6, "lr": 0.1, "local_steps": 4, "batch_size": 8},
    "cluster": {"num_actors": 2},
}
METRICS = ["test_accuracy", "test_loss", "train_loss"]


def run(tmp_path, name, **overrides):
    return raysim.run(SMALL, out=tmp_path / name, **overrides)


def run_local(tmp_path, name, **overrides):
    return raysim.run(SMALL, out=tmp_path / name, backend="local", **overrides)


def test_results_tables_and_columns(tmp_path):
    result = run_local(tmp_path, "cols")
    rounds = pd.read_parquet(tmp_path / "cols" / "rounds.parquet")
    assert list(rounds["round"]) == [1, 2, 3, 4]
    for col in ["round", "clients", "oracle_calls", "upload_bytes", "wall_s", "sim_time", "gamma", *METRICS]:
        assert col in rounds, col
    assert (rounds["clients"] == 6).all()
    assert np.all(np.diff(rounds["oracle_calls"]) > 0) and np.all(np.diff(rounds["wall_s"]) > 0)
    clients = pd.read_parquet(tmp_path / "cols" / "clients.parquet")
    assert len(clients) == 4 * 6
    for col in ["round", "client_id", "oracle_calls", "upload_bytes", "compute_time", "upload_time", "finish_time", "dropped"]:
        assert col in clients, col
    per_round = clients.groupby("round")["oracle_calls"].sum().cumsum().to_numpy()
    np.testing.assert_array_equal(per_round, rounds["oracle_calls"].to_numpy())
    assert (clients["cpu_s"] > 0).all()  # measured: each client's share of its shard's vectorized step
    np.testing.assert_allclose(clients.groupby("round")["cpu_s"].sum().to_numpy(), rounds["client_cpu_s"].to_numpy())
    assert (tmp_path / "cols" / "config.yaml").exists()
    assert json.loads((tmp_path / "cols" / "run.json").read_text())["status"] == "finished"
    pd.testing.assert_frame_equal(result.rounds, rounds)
    other = run_local(tmp_path, "seed8", seed=8, eval__every=3).rounds  # evaluated in rounds 3 and 4 (the last)
    assert other["test_loss"].isna().tolist() == [True, True, False, False]  # columns kept though round 1 lacks them
    assert not np.allclose(other["test_loss"][2:], rounds["test_loss"][2:])  # another seed, another run


@register_algorithm("crash_at_round_3")
class CrashAtRound3(FedAvg):
    """FedAvg whose server fails in round 3, as a bug in a user's algorithm would."""

    def aggregate(self, state, replies, rng):
        if getattr(self, "_round", 0) == 2:
            raise RuntimeError("boom in round 3")
        self._round = getattr(self, "_round", 0) + 1
        return super().aggregate(state, replies, rng)


def test_crash_mid_run_keeps_finished_rounds(ray_cluster, tmp_path):
    with pytest.raises(Exception, match="boom in round 3"):  # raised in the server actor, re-raised in the driver
        run(tmp_path, "crash", algorithm__name="crash_at_round_3", algorithm__rounds=6)
    rounds = pq.read_table(tmp_path / "crash" / "rounds.parquet").to_pandas()
    assert list(rounds["round"]) == [1, 2]
    info = json.loads((tmp_path / "crash" / "run.json").read_text())
    assert info["status"] == "failed" and "boom in round 3" in info["error"] and info["rounds_done"] == 2


def test_divergence_stops_with_partial_results(tmp_path):
    with pytest.raises(DivergenceError, match="non-finite"):
        run_local(tmp_path, "nan", algorithm__lr=1e20, algorithm__rounds=20)
    rounds = pd.read_parquet(tmp_path / "nan" / "rounds.parquet")
    assert 1 <= len(rounds) < 20
    assert not np.isfinite(rounds["test_loss"].iloc[-1])


def test_algorithm_registered_outside_raysim_runs_on_actors(ray_cluster, tmp_path):
    @register_algorithm("fedavg_half_lr")
    class HalfLR(FedAvg):
        def aggregate(self, state, replies, rng):
            new, cost = super().aggregate(state, replies, rng)
            return type(state)(state.params + 0.5 * (new.params - state.params)), cost

    assert issubclass(HalfLR, Algorithm)
    result = run(tmp_path, "half", algorithm__name="fedavg_half_lr")
    assert len(result.rounds) == 4


@pytest.mark.slow  # long; run with -m slow (the chaos suite's SIGKILL-and-truncate schedule stays)
def test_resume_after_sigkill_reaches_the_same_numbers(ray_cluster, tmp_path):
    """A driver killed with SIGKILL mid-run (backend local: the whole run in that process); `--resume`
    finishes it on Ray from its checkpoint, and the numbers are those of an uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    cfg = {**SMALL, "algorithm": {**SMALL["algorithm"], "rounds": 60, "local_steps": 40}, "checkpoint": {"every": 3},
           "backend": "local"}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", str(tmp_path / "cfg.yaml"), "--out",
                             str(run_dir), "--quiet"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            rounds = run_dir / "rounds.parquet"
            if rounds.exists() and pq.read_metadata(rounds).num_rows >= 7:
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    saved = pq.read_metadata(run_dir / "rounds.parquet").num_rows
    assert 7 <= saved < 60, "the driver was not killed mid-run"
    resumed = raysim.run(None, ["backend=ray"], resume=run_dir)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["resumed_from"] % 3 == 0 and 6 <= info["resumed_from"] <= saved and info["backend"] == "ray"
    clean = raysim.run(cfg, out=tmp_path / "clean")
    pd.testing.assert_frame_equal(reproducible(clean.rounds), reproducible(resumed.rounds))
    pd.testing.assert_frame_equal(reproducible(clean.clients), reproducible(resumed.clients))


def test_a_run_needs_a_config_unless_it_resumes(tmp_path):
    """`config` may be None only with resume=: otherwise a ConfigError in one line, not a TypeError from Path(None)."""
    with pytest.raises(raysim.ConfigError, match="no config given"):
        raysim.run(None, out=tmp_path / "run")


def test_client_actors_launched_before_the_data_are_stopped_when_the_data_fail(ray_cluster, tmp_path):
    """The client actors start while the data are built; a data file that is missing still fails in one DataError,
    and the actors launched for the run give their CPUs back to the session's Ray."""
    from raysim.errors import DataError

    cpus = ray.cluster_resources()["CPU"]
    with pytest.raises(DataError, match="data.path"):
        raysim.run(SMALL, {"data.source": "parquet", "data.path": str(tmp_path / "missing.parquet"),
                           "data.label_column": "y", "data.partition.kind": "iid", "cluster.driver_shard": False},
                   out=tmp_path / "nodata")
    deadline = time.monotonic() + 60  # ray.kill returns before the raylet frees the actors' resources
    while ray.available_resources().get("CPU", 0) < cpus and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == cpus


def _files(run_dir):
    """{relative path: bytes} of every file under `run_dir`."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def test_out_on_a_run_is_refused_and_overwrite_replaces_it_whole(tmp_path):
    """A second run into the same --out is refused with the run untouched; `overwrite=True` removes the old run
    first, so the directory holds exactly what a run into a new directory holds (no old client parts or checkpoints)."""
    from raysim.errors import RunDirError

    first = run_local(tmp_path, "same", algorithm__rounds=6, checkpoint__every=2)
    before = _files(first.run_dir)
    with pytest.raises(RunDirError, match=r"already holds a run: `--resume .*same` continues it, `--overwrite` replaces it"):
        run_local(tmp_path, "same", seed=8)
    assert _files(first.run_dir) == before
    replaced = run_local(tmp_path, "same", seed=8, overwrite=True)
    fresh = run_local(tmp_path, "fresh", seed=8)
    pd.testing.assert_frame_equal(reproducible(replaced.rounds), reproducible(fresh.rounds))
    pd.testing.assert_frame_equal(reproducible(replaced.clients), reproducible(fresh.clients))
    assert sorted(p.name for p in (replaced.run_dir / "checkpoints").glob("round-*")) == ["round-000004"]
    assert sorted(_files(replaced.run_dir)) == sorted(_files(fresh.run_dir))


@pytest.mark.slow  # long; run with -m slow
def test_a_stopped_run_checkpoints_its_last_round(ray_cluster, tmp_path):
    """A callback stops the run after round 5 (checkpoint.every 4): round 5 is checkpointed, so the exported model is
    round 5's, and a resume continues after it to the numbers of a run never stopped (the local backend's: the
    same bits). On Ray round 6 was already sent to the client actors: theirs are brought back to round 5 before
    they save (SCAFFOLD's client control variates show it)."""
    from raysim.results.export import trained_model

    cfg = {**SMALL, "algorithm": {**SMALL["algorithm"], "name": "scaffold", "rounds": 8}, "checkpoint": {"every": 4},
           "cluster": {"num_actors": 2, "driver_shard": False}}
    whole = raysim.run(cfg, out=tmp_path / "whole", backend="local")
    part = raysim.run(cfg, out=tmp_path / "part", on_round=lambda row: row["round"] < 5)
    assert part.info["status"] == "stopped" and len(part.rounds) == 5
    assert trained_model(part.run_dir).round == 5
    resumed = raysim.run(None, resume=part.run_dir)
    assert resumed.info["resumed_from"] == 5
    pd.testing.assert_frame_equal(reproducible(whole.rounds), reproducible(resumed.rounds))
    pd.testing.assert_frame_equal(reproducible(whole.clients), reproducible(resumed.clients))


def test_resume_falls_back_past_a_damaged_checkpoint_to_the_same_numbers(tmp_path, caplog):
    """The newest checkpoint's shard file truncated: one warning names it, the previous intact checkpoint is used,
    the tables are cut back to its round, and the run finishes with the numbers of a run never interrupted."""
    import logging

    whole = run_local(tmp_path, "whole", algorithm__rounds=9, checkpoint__every=3)
    part = run_local(tmp_path, "part", algorithm__rounds=9, checkpoint__every=3, on_round=lambda row: row["round"] < 7)
    shard = part.run_dir / "checkpoints" / "round-000007" / "shard-0000.pkl"
    kept = len(shard.read_bytes()) // 2
    shard.write_bytes(shard.read_bytes()[:kept])
    with caplog.at_level(logging.WARNING, "raysim"):
        resumed = raysim.run(None, resume=part.run_dir)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"damaged checkpoint (round 7: shard-0000.pkl has {kept} bytes" in warning and "resuming from round 6" in warning
    assert resumed.info["resumed_from"] == 6
    pd.testing.assert_frame_equal(reproducible(whole.rounds), reproducible(resumed.rounds))
    pd.testing.assert_frame_equal(reproducible(whole.clients), reproducible(resumed.clients))


@pytest.mark.parametrize("sig", ["SIGINT", pytest.param("SIGTERM", marks=pytest.mark.slow)])  # SIGTERM on Ray: test_chaos
def test_a_signal_stops_after_the_round_with_a_checkpoint_and_resume_continues_bitwise(tmp_path, sig):
    """SIGINT (Ctrl-C) or SIGTERM (a batch scheduler) to `raysim run`: the round in flight finishes, the tables and
    a checkpoint of it are written, run.json says `interrupted`, one line says how to resume, and the exit status
    is 128 + the signal; `--resume` then finishes the run with the numbers of a run never interrupted."""
    import os
    import signal
    import subprocess
    import sys

    import yaml

    cfg = {**SMALL, "algorithm": {**SMALL["algorithm"], "rounds": 400}, "backend": "local"}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", "run", str(tmp_path / "cfg.yaml"), "--out",
                             str(run_dir), "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (run_dir / "rounds.parquet").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    number = getattr(signal, sig).value
    assert proc.returncode == 128 + number, err
    info = json.loads((run_dir / "run.json").read_text())
    done = info["rounds_done"]
    assert info["status"] == "interrupted" and info["signal"] == sig and 1 <= done < 400
    assert err.strip().splitlines()[-1] == f"interrupted by {sig} after round {done}: `raysim run --resume {run_dir}` continues it"
    assert "Traceback" not in err
    assert json.loads((run_dir / "checkpoints" / "latest.json").read_text())["round"] == done
    resumed = raysim.run(None, resume=run_dir)
    assert resumed.info["resumed_from"] == done and resumed.info["status"] == "finished"
    clean = raysim.run(cfg, out=tmp_path / "clean")
    pd.testing.assert_frame_equal(reproducible(clean.rounds), reproducible(resumed.rounds))
    pd.testing.assert_frame_equal(reproducible(clean.clients), reproducible(resumed.clients))
