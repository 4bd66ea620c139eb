"""The wandb and mlflow callbacks, read back through the libraries' own formats: W&B's offline transaction
log (its Record protobufs) and MLflow's client on the run's file store hold the run's config and every
numeric round column at step = round, equal to rounds.parquet; the run's end is FINISHED or FAILED; a
missing library is one line naming the extra."""
import json
import math
import struct
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from wandb.proto.wandb_internal_pb2 import Record

import raysim
from raysim.callbacks.trackers import tracked
from raysim.config import load_config
from raysim.errors import ConfigError

QUICK = str(Path(__file__).resolve().parents[2] / "configs/fedavg/quickstart.yaml")
SMALL = {"backend": "local", "data.num_clients": 20, "algorithm.clients_per_round": 5, "algorithm.local_steps": 2,
         "algorithm.rounds": 3}


def expected(rounds) -> dict[str, dict[int, float]]:
    """Every numeric round column but the round itself: {column: {round: value}}."""
    out = {}
    for col in rounds.columns:
        if col != "round" and rounds[col].dtype.kind in "iuf":
            out[col] = {int(r): float(v) for r, v in zip(rounds["round"], rounds[col]) if math.isfinite(v)}
    return out


def wandb_records(run_dir: Path) -> list[Record]:
    """The records of the run's one offline .wandb file: W&B's LevelDB-style log (a 7-byte header, then
    32 KiB blocks of chunks with a 7-byte crc/length/type header; type 1 full, 2-4 first/middle/last)."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    data, pos, chunk, out = path.read_bytes(), 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            out.append(Record.FromString(chunk))
            chunk = b""
    return out


def wandb_logged(records: list[Record]) -> tuple[dict, dict[str, dict[int, float]], list[int]]:
    """(config, {key: {step: value}}, exit codes) of a W&B run's records."""
    config, history, exits = {}, {}, []
    for rec in records:
        kind = rec.WhichOneof("record_type")
        if kind in ("run", "config"):
            updates = rec.run.config.update if kind == "run" else rec.config.update
            config.update({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in updates})
        elif kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            for key, value in row.items():
                history.setdefault(key, {})[row["_step"]] = value
        elif kind == "exit":
            exits.append(rec.exit.exit_code)
    return config, history, exits


def test_wandb_offline_run_holds_the_config_and_every_round(tmp_path):
    res = raysim.run(QUICK, {**SMALL, "callbacks": [{"kind": "wandb", "project": "proj", "name": "first"}]},
                     out=tmp_path / "wb")
    records = wandb_records(res.run_dir)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name) == ("proj", "first")
    config, history, exits = wandb_logged(records)
    saved = tracked(yaml.safe_load((res.run_dir / "config.yaml").read_text()))
    assert {k: config[k] for k in saved} == saved and config["algorithm.lr"] == 0.1
    want = expected(res.rounds)
    assert {"test_accuracy", "sim_time", "gamma", "upload_bytes"} <= set(want)
    assert {k: history[k] for k in want} == want
    assert "round" not in history and "checkpoint" not in history and exits == [0]


def test_mlflow_run_holds_the_config_and_every_round(tmp_path):
    res = raysim.run(QUICK, {**SMALL, "callbacks": [{"kind": "mlflow"}]}, out=tmp_path / "ml")
    client = MlflowClient((res.run_dir / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
    assert run.info.run_name == "ml" and run.info.status == "FINISHED"
    params = run.data.params
    assert params == {k: str(v) for k, v in tracked(yaml.safe_load((res.run_dir / "config.yaml").read_text())).items()}
    assert params["algorithm.lr"] == "0.1" and params["data.partition.alpha"] == "0.5"
    # what the run uses, not every section's defaults: no layout, no other source's or partition's settings
    assert not [k for k in params if k.startswith(("cluster.", "data.synthetic_", "data.mnist1d_", "model.channels",
                                                   "system.clock.time_scale", "system.availability.p", "checkpoint."))]
    assert len(params) < 50
    want = expected(res.rounds)
    assert set(run.data.metrics) == set(want)
    for key, values in want.items():
        assert {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} == values, key


def test_a_failed_run_ends_failed_in_both_trackers(tmp_path):
    """A run that fails at round 1 (a metric it lacks, of an algorithm that does not declare its metrics) closes its
    W&B run with exit code 1 and its MLflow run (here in a store, experiment and run name of the config's choosing)
    as FAILED."""
    store = (tmp_path / "store").as_uri()
    callbacks = [{"kind": "wandb"}, {"kind": "mlflow", "tracking_uri": store, "experiment": "exp", "run_name": "bad"},
                 {"kind": "best_model", "metric": "test_acc"}]
    with pytest.raises(ConfigError, match="test_acc"):
        raysim.run(QUICK, {**SMALL, "algorithm.name": "fedavg_undeclared", "callbacks": callbacks}, out=tmp_path / "bad")
    assert wandb_logged(wandb_records(tmp_path / "bad"))[2] == [1]
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("exp").experiment_id])
    assert run.info.run_name == "bad" and run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_accuracy")] == [1]  # logged before it failed


@pytest.mark.parametrize("kind", ["wandb", "mlflow"])
def test_a_missing_library_names_the_extra(kind, monkeypatch):
    monkeypatch.setitem(sys.modules, kind, None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ConfigError) as err:
        load_config(QUICK, {"callbacks": [{"kind": kind}]})
    assert str(err.value).count("\n") == 0
    assert str(err.value).endswith(f"callbacks.0.{kind}: kind {kind} needs the optional extra: pip install 'raysim-fl[{kind}]'")
