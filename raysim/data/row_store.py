"""The training rows as two flat arrays on disk beside the Parquet file (`data.client_rows: disk`), for federations
too large for their shards to hold: a shard reads the rows of its round's clients each round, through a memory map
opened for that read alone, so no page of the file stays mapped in between and the memory of a run grows with the
clients a round, not with the registered clients.

The files are `train_x.npy` and `train_y.npy`: the training file's x and y in its row order (clients in id order,
each client's rows contiguous), copied from it a row group at a time.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysim.data.config import DataConfig

AUTO_BYTES = 1 << 30  # `client_rows: auto` reads from disk above this many bytes of training features


def on_disk(cfg: DataConfig, num_train: int, feature_shape: tuple[int, ...]) -> bool:
    """Whether shards read their clients' rows each round: `data.client_rows` disk, or auto with more than
    AUTO_BYTES of training features (counted as float32)."""
    if cfg.client_rows != "auto":
        return cfg.client_rows == "disk"
    return num_train * 4 * math.prod(feature_shape) > AUTO_BYTES


def row_paths(train_path: str | Path) -> tuple[Path, Path]:
    """The x and y files of the training file `train_path`."""
    train_path = Path(train_path)
    return train_path.with_name("train_x.npy"), train_path.with_name("train_y.npy")


def write_rows(train_path: str | Path, arrays: Callable[[pa.Table], tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """Copy the training file's x and y into `row_paths`, a row group at a time (`arrays` turns a row group into
    (client_id, x, y)), through plain writes (the page cache's, not this process's memory); each file is written
    under a temporary name and renamed when whole."""
    file = pq.ParquetFile(train_path)
    _, x0, y0 = arrays(file.schema_arrow.empty_table())
    n = file.metadata.num_rows
    paths = row_paths(train_path)
    tmps = [p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in paths]
    try:
        with open(tmps[0], "wb") as fx, open(tmps[1], "wb") as fy:
            for f, a in ((fx, x0), (fy, y0)):
                header = {"descr": np.lib.format.dtype_to_descr(a.dtype), "fortran_order": False, "shape": (n, *a.shape[1:])}
                np.lib.format.write_array_header_2_0(f, header)
            for g in range(file.num_row_groups):
                _, x, y = arrays(file.read_row_group(g))
                fx.write(np.ascontiguousarray(x).tobytes())
                fy.write(np.ascontiguousarray(y).tobytes())
        for t, p in zip(tmps, paths):
            os.replace(t, p)
    finally:
        for t in tmps:
            t.unlink(missing_ok=True)


def read_rows_of(train_path: str | Path, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the row ranges [starts[i], starts[i] + sizes[i]) one after another, read through memory maps
    closed again before returning."""
    starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    rows = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
    x_path, y_path = row_paths(train_path)
    x_map, y_map = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    try:
        return np.asarray(x_map[rows]), np.asarray(y_map[rows])
    finally:
        del x_map, y_map
