"""Callbacks from the config and from Python: early stopping at exactly the evaluation the rule names,
the best model's state equal to a rerun's state at that round, TensorBoard scalars and the CSV file equal
to rounds.parquet, a server view from the server actor, and a metric the run lacks as one line."""
import json
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tensorboardX.proto import event_pb2

import raysim
from raysim.algorithms.fedavg import FedAvg
from raysim.callbacks import Callback
from raysim.cli import main
from raysim.config import load_config
from raysim.results import reproducible
from raysim.storage import checkpoint

QUICK = str(Path(__file__).resolve().parents[2] / "configs/fedavg/quickstart.yaml")
SMALL = {"backend": "local", "data.num_clients": 20, "algorithm.clients_per_round": 5, "algorithm.local_steps": 2}


def run(tmp_path, name, rounds, callbacks=None, **overrides):
    return raysim.run(QUICK, {**SMALL, "algorithm.rounds": rounds, "callbacks": callbacks or [], **overrides},
                      out=tmp_path / name)


def expected_stop(values: list[float], patience: int, min_delta: float) -> int:
    """The 1-based index of the evaluation at which max-mode early stopping fires (len+1: never)."""
    best, waited = None, 0
    for i, v in enumerate(values, 1):
        if best is None or v > best + min_delta:
            best, waited = v, 0
        else:
            waited += 1
            if waited >= patience:
                return i
    return len(values) + 1


def test_early_stopping_stops_at_the_evaluation_the_rule_names(tmp_path):
    full = run(tmp_path, "full", 24, **{"eval.every": 2})
    accuracies = full.rounds["test_accuracy"].dropna().tolist()  # rounds 2, 4, ..., 24
    for patience, min_delta in [(1, 0.02), (2, 0.03)]:
        stop = expected_stop(accuracies, patience, min_delta)
        assert stop <= len(accuracies) - 1, "the case must stop early to test anything"
        es = run(tmp_path, f"es{patience}", 24, [{"kind": "early_stopping", "metric": "test_accuracy",
                                                 "patience": patience, "min_delta": min_delta}], **{"eval.every": 2})
        assert es.rounds["round"].max() == 2 * stop  # rounds between evaluations do not count
        assert es.info["status"] == "stopped" and es.info["stopped_by"] == ["EarlyStopping"]
        pd.testing.assert_frame_equal(reproducible(es.rounds), reproducible(full.rounds.iloc[:2 * stop]))


def test_best_model_is_the_state_of_the_best_round(tmp_path):
    res = run(tmp_path, "best", 12, [{"kind": "best_model", "metric": "test_accuracy"}])
    accuracy = res.rounds.set_index("round")["test_accuracy"]
    best = json.loads((res.run_dir / "best_model" / "best.json").read_text())
    assert best["round"] == int(accuracy.idxmax()) and best["value"] == accuracy.max() and best["mode"] == "max"
    assert best["round"] < 12, "pick a case whose best round is not the last"
    saved = checkpoint.load(res.run_dir / "best_model" / "server.pkl")
    rerun = run(tmp_path, "rerun", best["round"])  # the same run, stopped at the best round: its final state
    state, _ = checkpoint.load(checkpoint.checkpoint_dir(rerun.run_dir, best["round"]) / "server.pkl")
    assert np.array_equal(saved.params, state.params)
    last, _ = checkpoint.load(checkpoint.checkpoint_dir(res.run_dir, 12) / "server.pkl")
    assert not np.array_equal(saved.params, last.params)


def events(folder: Path) -> dict[str, dict[int, float]]:
    """Scalars of the TensorBoard event files in `folder`: {tag: {step: value}} (TFRecord framing)."""
    out: dict[str, dict[int, float]] = {}
    for path in folder.glob("events.out.tfevents.*"):
        data = path.read_bytes()
        i = 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in event.summary.value:
                out.setdefault(v.tag, {})[event.step] = v.simple_value
    return out


def test_tensorboard_and_csv_hold_every_round(tmp_path):
    res = run(tmp_path, "tb", 4, [{"kind": "tensorboard"}, {"kind": "csv"}])
    scalars = events(res.run_dir / "tensorboard")
    for tag in ("test_accuracy", "test_loss", "sim_time", "gamma", "upload_bytes"):
        want = res.rounds.set_index("round")[tag].astype(np.float32)
        assert scalars[tag] == {int(r): pytest.approx(float(v), rel=1e-6) for r, v in want.items()}, tag
    assert "round" not in scalars and "checkpoint" not in scalars
    csv = pd.read_csv(res.run_dir / "rounds.csv")
    numeric = [c for c in csv.columns if c not in ("phase", "checkpoint")]
    np.testing.assert_allclose(csv[numeric].to_numpy(float), res.rounds[numeric].to_numpy(float), rtol=1e-12)


def test_a_resumed_run_logs_each_round_once(tmp_path):
    """Rounds 1-5 logged, then the run resumed from round 4 (round 5's checkpoint damaged): rounds.csv holds each
    round once, the values of the resumed run (TensorBoard's own purge_step drops its steps past round 4)."""
    hooks = [{"kind": "tensorboard"}, {"kind": "csv"}]
    part = raysim.run(QUICK, {**SMALL, "algorithm.rounds": 8, "callbacks": hooks, "checkpoint.every": 2},
                      out=tmp_path / "part", on_round=lambda row: row["round"] < 5)
    (part.run_dir / "checkpoints" / "round-000005" / "server.pkl").write_bytes(b"")
    res = raysim.run(None, resume=part.run_dir)
    assert res.info["resumed_from"] == 4
    csv = pd.read_csv(res.run_dir / "rounds.csv")
    assert csv["round"].tolist() == list(range(1, 9))
    np.testing.assert_allclose(csv["test_loss"].to_numpy(float), res.rounds["test_loss"].to_numpy(float), rtol=1e-12)


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_run_start(self, run):
        self.calls.append(("start", run.start_round, run.cfg.algorithm.rounds))

    def on_round_end(self, row, server):
        state = server.state()
        self.calls.append(("round", row["round"], type(state).__name__, state.params.shape))
        state.params[:] = 0  # a copy: changing it changes nothing in the run
        return False if row["round"] == 2 else None

    def on_run_end(self, run, status):
        self.calls.append(("end", status))


@pytest.mark.slow  # long; run with -m slow
def test_python_callback_sees_the_server_actor_state_and_stops_the_run(tmp_path, ray_cluster):
    rec, rows = Recorder(), []
    res = raysim.run(QUICK, {**SMALL, "backend": "ray", "cluster.server": "actor", "algorithm.rounds": 5},
                     out=tmp_path / "py", callbacks=[rec], on_round=rows.append)
    plain = run(tmp_path, "plain", 5)
    assert [c[0] for c in rec.calls] == ["start", "round", "round", "end"]
    assert rec.calls[0] == ("start", 0, 5) and rec.calls[-1] == ("end", "stopped")
    assert rec.calls[1][2] == "ServerState" and rec.calls[1][3] == plain_shape(plain)
    assert [r["round"] for r in rows] == [1, 2] and res.info["stopped_by"] == ["Recorder"]
    pd.testing.assert_frame_equal(reproducible(res.rounds), reproducible(plain.rounds.iloc[:2]))


def plain_shape(res) -> tuple:
    state, _ = checkpoint.load(checkpoint.checkpoint_dir(res.run_dir, 5) / "server.pkl")
    return state.params.shape


@pytest.mark.parametrize("algorithm, before_the_run, kind", [("fedavg", True, "best_model"),
                                                              ("fedavg", True, "early_stopping, patience: 3"),
                                                              ("fedavg_undeclared", False, "best_model")])
def test_a_metric_the_run_lacks_is_one_line(tmp_path, capsys, algorithm, before_the_run, kind):
    """Checked against the metrics the algorithm declares before anything starts (no run directory), for every
    callback that watches a metric; an algorithm that declares none is checked at its first evaluated round, and
    its run says why it failed."""
    out = tmp_path / "lacks"
    status = main(["run", QUICK, "backend=local", "algorithm.rounds=2", "data.num_clients=20", f"algorithm.name={algorithm}",
                   f"callbacks=[{{kind: {kind}, metric: test_acc}}]", "--out", str(out), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1 and "callbacks.0.metric: 'test_acc'" in err[0] and "test_accuracy" in err[0]
    if before_the_run:
        assert not out.exists()
    else:
        info = json.loads((out / "run.json").read_text())
        assert info["status"] == "failed" and "test_acc" in info["error"] and info["rounds_done"] == 1


def test_fedavgs_declared_metrics_are_the_ones_its_rounds_have(tmp_path):
    """Every metric a private run with federated evaluation writes is declared, and every declared one is written."""
    cfg = load_config(QUICK, {**SMALL, "algorithm.rounds": 2, "eval.clients": "all",
                              "privacy": {"clip": 1.0, "noise_multiplier": 1.0}})
    res = raysim.run(cfg, out=tmp_path / "declared", progress=False)
    runtime = {"round", "phase", "clients", "selected", "dropped", "gamma", "sim_time", "oracle_calls", "upload_bytes",
               "download_bytes", "server_oracle_calls", "server_oracle_batches", "round_sim_time", "round_wall_s",
               "client_cpu_s", "actor_restarts", "checkpoint", "wall_s"}
    assert set(res.rounds.columns) - runtime == FedAvg.metric_names(cfg)
