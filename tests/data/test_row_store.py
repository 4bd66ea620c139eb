"""The row store (`data.client_rows: disk`): the training file's rows as flat files a shard reads per round."""
import numpy as np
import pytest

from raysim.config import load_config
from raysim.data import build_federated, read_client_block, read_rows
from raysim.data.row_store import AUTO_BYTES, on_disk, read_rows_of, row_paths

SYNTHETIC = {
    "name": "rows", "seed": 2,
    "data": {"source": "synthetic", "num_clients": 60, "partition": {"kind": "natural"},
             "synthetic_samples": 1500, "synthetic_features": 6},
    "algorithm": {"name": "fedavg", "rounds": 1, "clients_per_round": 5},
}


DIGITS = {**SYNTHETIC, "data": {"source": "digits", "num_clients": 60, "partition": {"kind": "dirichlet", "alpha": 1.0}}}


@pytest.mark.parametrize("experiment", [SYNTHETIC, DIGITS], ids=["by-blocks", "pooled"])
def test_the_row_files_hold_every_client_s_rows_as_the_parquet_file_does(tmp_path, experiment):
    cfg = load_config(experiment, {"data.client_rows": "disk"})
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    x_path, y_path = row_paths(fed.train_path)
    assert x_path.exists() and y_path.exists() and not list(tmp_path.glob(".*tmp"))
    rows = np.array([0, 7, 8, fed.num_test - 1])
    tx, ty = read_rows_of(fed.test_path, rows, np.ones(4, dtype=np.int64))
    px, py = read_rows(fed.test_path, rows)
    assert np.array_equal(tx, px) and np.array_equal(ty, py)
    sizes = np.asarray(fed.client_sizes)
    picked = np.array([41, 3, 17, 59, 0])  # any order: the rows come back in the order asked
    x, y = read_rows_of(fed.train_path, (np.cumsum(sizes) - sizes)[picked], sizes[picked])
    ids, offsets, bx, by = read_client_block(fed.train_path, picked)
    at = {int(c): i for i, c in enumerate(ids)}
    order = np.concatenate([np.arange(offsets[at[c]], offsets[at[c] + 1]) for c in picked])
    assert x.dtype == bx.dtype and np.array_equal(x, bx[order]) and np.array_equal(y, by[order])


def test_memory_writes_no_row_files_and_auto_reads_from_disk_only_above_a_gib(tmp_path):
    cfg = load_config(SYNTHETIC)
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    assert not any(p.exists() for p in row_paths(fed.train_path))
    rows = AUTO_BYTES // (4 * 20)
    assert not on_disk(cfg.data, rows, (20,)) and on_disk(cfg.data, rows + 1, (20,))
    assert not on_disk(load_config(SYNTHETIC, {"data.client_rows": "memory"}).data, 10 * rows, (20,))
    assert on_disk(load_config(SYNTHETIC, {"data.client_rows": "disk"}).data, 1, (20,))


def test_an_unknown_mode_is_refused():
    with pytest.raises(Exception, match="client_rows"):
        load_config(SYNTHETIC, {"data.client_rows": "cloud"})
