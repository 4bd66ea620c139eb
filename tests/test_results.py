"""Result tables: atomic Parquet writes that keep every column, read back with pandas (a real run with
metrics missing from its first rounds: tests/test_runner.py::test_results_tables_and_columns)."""
import math

import pandas as pd

from raysim.results import write_parquet


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

