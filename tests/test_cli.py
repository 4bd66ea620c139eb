"""The `raysim` command as a new user runs it (each call starts and stops its own local Ray)."""
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

import raysim
from raysim.results import reproducible

ROOT = Path(__file__).resolve().parents[1]
RAYSIM = [sys.executable, "-m", "raysim.cli"]


def cli(*args, timeout=300):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([*RAYSIM, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_quickstart_reaches_target_accuracy_and_the_local_backend_gives_the_same_bits(tmp_path):
    out = tmp_path / "quickstart"
    proc = cli("run", "configs/fedavg/quickstart.yaml", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rounds = pd.read_parquet(out / "rounds.parquet")
    assert len(rounds) == 60
    assert rounds["test_accuracy"].iloc[-1] >= 0.85
    assert (rounds["gamma"] > 0).all() and (rounds["sim_time"] > 0).all()
    assert "results:" in proc.stdout and "test_accuracy=" in proc.stdout
    on_ray = raysim.RunResult.load(out)
    local = raysim.run(ROOT / "configs/fedavg/quickstart.yaml", out=tmp_path / "local", backend="local")
    for table in ("rounds", "clients"):
        pd.testing.assert_frame_equal(reproducible(getattr(local, table)), reproducible(getattr(on_ray, table)))

    report = cli("report", out)
    assert report.returncode == 0, report.stderr
    for name in ("metrics_vs_round.png", "metrics_vs_sim_time.png", "metrics_vs_gamma.png", "client_timeline.png"):
        assert (out / name).stat().st_size > 10_000, name
    both = cli("report", out, tmp_path / "local", "--out", tmp_path / "compare")
    assert both.returncode == 0, both.stderr
    for metric in ("test_accuracy", "test_loss", "train_loss"):
        assert (tmp_path / "compare" / f"compare_{metric}.png").stat().st_size > 20_000, metric


def test_overrides_and_config_errors_before_ray_starts(tmp_path):
    proc = cli("run", "configs/fedavg/quickstart.yaml", "algorithm.lr=-1", "data.test_fraction=1.5", "--out", tmp_path / "x")
    assert proc.returncode == 2
    text = proc.stdout + proc.stderr
    assert "algorithm.lr" in text and "data.test_fraction" in text
    assert "ray" not in text.lower().replace("raysim", "")  # failed before any Ray process started
    assert not (tmp_path / "x").exists()


def test_list_shows_what_is_available():
    proc = cli("list")
    assert proc.returncode == 0
    for name in ("fedavg", "fedprox", "mlp", "cnn", "logreg", "digits", "mnist1d", "synthetic", "parquet",
                 "iid", "dirichlet", "shards", "quantity"):
        assert name in proc.stdout, name


def test_report_on_a_directory_that_is_not_a_run(tmp_path):
    proc = cli("report", tmp_path)
    assert proc.returncode != 0
    assert "not a raysim run directory" in proc.stdout + proc.stderr


def test_the_command_exits_without_collecting_the_finished_run():
    """`entry_point` (the installed command) returns main's status with the run's objects frozen, so Python's
    last collection at exit does not walk them; `main` itself, which tests call in-process, freezes nothing."""
    code = ("import gc, sys; from raysim.cli import entry_point, main; sys.argv = ['raysim', 'list']; "
            "status = main(); frozen = gc.get_freeze_count(); print(status, frozen, entry_point(), gc.get_freeze_count() > 10000)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.stdout.split()[-4:] == ["0", "0", "0", "True"], proc.stderr
