"""Result tables: atomic Parquet writes that keep every column, read back with pandas (a real run with
metrics missing from its first rounds: tests/runner/test_driver.py::test_results_tables_and_columns)."""
import math
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from raysim.results import tables as results
from raysim.storage.atomic import write_parquet


def test_columns_of_later_rows_are_kept(tmp_path):
    """Round 1 without metrics (eval.every > 1) must not drop the metric columns of later rounds."""
    rows = [{"round": 1, "loss": None}, {"round": 2}, {"round": 3, "loss": 0.5, "acc": 0.9}]
    rows[0].pop("loss")
    write_parquet(rows, tmp_path / "t.parquet")
    table = pd.read_parquet(tmp_path / "t.parquet")
    assert list(table.columns) == ["round", "loss", "acc"]
    assert math.isnan(table["loss"][0]) and table["loss"][2] == 0.5 and table["acc"][2] == 0.9


def test_empty_table(tmp_path):
    write_parquet([], tmp_path / "e.parquet")
    assert pd.read_parquet(tmp_path / "e.parquet").empty


def test_client_parts_load_in_round_order_with_the_union_of_their_columns(tmp_path):
    """RunResult.load reads clients.parquet/round-*.parquet as one dataset: 12 parts in round order (written out of
    order), a column that only later rounds have is null before."""
    from raysim.results import RunResult

    write_parquet([{"round": 1}], tmp_path / "rounds.parquet")
    for r in (3, 11, 1, 12, 2, 4, 5, 6, 7, 8, 9, 10):
        rows = [{"round": r, "client": c, "loss": r + c / 10, **({"extra": float(r)} if r > 10 else {})} for c in range(3)]
        write_parquet(rows, tmp_path / "clients.parquet" / f"round-{r:06d}.parquet")
    clients = RunResult.load(tmp_path).clients
    assert clients["round"].tolist() == [r for r in range(1, 13) for _ in range(3)]
    assert clients["loss"].tolist() == [r + c / 10 for r in range(1, 13) for c in range(3)]
    assert clients["extra"].isna().sum() == 30 and clients["extra"].iloc[-1] == 12.0


def test_the_writer_batches_rounds_into_one_part_and_a_resume_cuts_a_part_at_the_checkpoint(tmp_path):
    """Rounds added within `flush_every_s` reach the disk together at `flush` (rounds.parquet and one clients
    part for rounds 1..3); resuming after round 2 keeps rounds 1..2 of that part; with no wait every round is written."""
    from raysim.results import RunResult, RunWriter

    writer = RunWriter(tmp_path, flush_every_s=3600)
    for r in (1, 2, 3):
        writer.add({"round": r, "loss": 1.0 / r}, {"round": np.full(2, r), "client_id": np.arange(2)})
    assert not (tmp_path / "rounds.parquet").exists()
    writer.status(status="stopped")  # a status change writes the rounds first
    assert sorted(p.name for p in (tmp_path / "clients.parquet").iterdir()) == ["round-000001-000003.parquet"]
    assert RunResult.load(tmp_path).clients["round"].tolist() == [1, 1, 2, 2, 3, 3]

    resumed = RunWriter(tmp_path, resume_round=2, flush_every_s=0)
    resumed.add({"round": 3, "loss": 0.25}, {"round": np.array([3]), "client_id": np.array([5])})
    result = RunResult.load(tmp_path)
    assert result.rounds["loss"].tolist() == [1.0, 0.5, 0.25]
    assert result.clients[["round", "client_id"]].values.tolist() == [[1, 0], [1, 1], [2, 0], [2, 1], [3, 5]]
    assert sorted(p.name for p in (tmp_path / "clients.parquet").iterdir()) == ["round-000001-000002.parquet",
                                                                               "round-000003.parquet"]


def test_the_federated_evaluation_is_written_and_cut_at_a_resume_like_the_client_rows(tmp_path):
    """client_eval.parquet parts hold the evaluated rounds' rows; a resume after round 2 drops round 3's."""
    from raysim.results import RunResult, RunWriter

    writer = RunWriter(tmp_path, flush_every_s=3600)
    for r in (1, 2, 3):
        evals = {"round": np.full(2, r), "client_id": np.array([4, 7]), "accuracy": np.array([0.5, r / 10])} if r != 2 else None
        writer.add({"round": r}, {"round": np.full(1, r), "client_id": np.arange(1)}, evals)
    writer.flush()
    assert RunResult.load(tmp_path).client_eval[["round", "client_id"]].values.tolist() == [[1, 4], [1, 7], [3, 4], [3, 7]]
    RunWriter(tmp_path, resume_round=2, flush_every_s=0)
    result = RunResult.load(tmp_path)
    assert result.client_eval["round"].tolist() == [1, 1] and result.clients["round"].tolist() == [1, 2]



def test_runs_that_start_in_the_same_second_each_claim_their_own_directory(tmp_path, monkeypatch):
    """Making the directory claims the name: a run that makes `base` between another's look and its mkdir
    (simulated here at the first mkdir) sends that one on to base-1, instead of failing or sharing base."""
    monkeypatch.setattr(results, "datetime", SimpleNamespace(now=lambda: datetime(2026, 11, 26, 5, 0, 0)))
    base = tmp_path / "quick-20261126-050000"
    mkdir = Path.mkdir

    def raced(self: Path, *args, **kwargs) -> None:
        if self == base and not self.exists():
            mkdir(self, *args, **kwargs)  # the other run, first
        mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", raced)
    assert results.new_run_dir("quick", tmp_path) == tmp_path / "quick-20261126-050000-1" and base.is_dir()
    assert results.new_run_dir("quick", tmp_path) == tmp_path / "quick-20261126-050000-2"
