"""A table's rows as two flat arrays on disk beside its Parquet file (`data.client_rows: disk`), for federations
too large for their shards to hold: a shard reads the rows of its round's clients each round, through a memory map
opened for that read alone, so no page of the file stays mapped in between and the memory of a run grows with the
clients a round, not with the registered clients.

The files are `train_x.npy` and `train_y.npy` (and `test_x.npy`, `test_y.npy`, for the server's samples of the test
set): each file's x and y in its row order (clients in id order, each client's rows contiguous), written beside the
Parquet file's row groups as they are written.
"""
from __future__ import annotations

import math
import os
import uuid
from pathlib import Path

import numpy as np

from raysim.data.config import DataConfig

AUTO_BYTES = 1 << 30  # `client_rows: auto` reads from disk above this many bytes of training features


def on_disk(cfg: DataConfig, num_train: int, feature_shape: tuple[int, ...]) -> bool:
    """Whether shards read their clients' rows each round: `data.client_rows` disk, or auto with more than
    AUTO_BYTES of training features (counted as float32)."""
    if cfg.client_rows != "auto":
        return cfg.client_rows == "disk"
    return num_train * 4 * math.prod(feature_shape) > AUTO_BYTES


def row_paths(path: str | Path) -> tuple[Path, Path]:
    """The x and y files of the table file `path` (train.parquet: train_x.npy, train_y.npy)."""
    path = Path(path)
    return path.with_name(f"{path.stem}_x.npy"), path.with_name(f"{path.stem}_y.npy")


class RowWriter:
    """The x and y rows of a table, appended in its order to `row_paths`' files under temporary names (plain
    writes: the page cache's memory, not this process's), renamed into place by `close(True)`."""

    def __init__(self, path: Path, rows: int, x: np.ndarray, y: np.ndarray):
        """`rows` rows in all, of the dtypes and row shapes of x and y."""
        self.paths = row_paths(path)
        self.tmps = [p.with_name(f".{p.name}.{uuid.uuid4().hex}.tmp") for p in self.paths]
        self.files = [open(t, "wb") for t in self.tmps]
        for f, a in zip(self.files, (x, y)):
            np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(a.dtype),
                                                     "fortran_order": False, "shape": (rows, *a.shape[1:])})

    def append(self, x: np.ndarray, y: np.ndarray) -> None:
        for f, a in zip(self.files, (x, y)):
            f.write(np.ascontiguousarray(a).data)  # the rows' own bytes, no copy

    def close(self, whole: bool) -> None:
        """Close the files; rename them into place when `whole`, else drop them."""
        try:
            for f in self.files:
                f.close()
            if whole:
                for t, p in zip(self.tmps, self.paths):
                    os.replace(t, p)
        finally:
            for t in self.tmps:
                t.unlink(missing_ok=True)


def read_rows_of(path: str | Path, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of the row ranges [starts[i], starts[i] + sizes[i]) of the table file `path`'s flat files, one after
    another, read through memory maps closed again before returning."""
    starts, sizes = np.asarray(starts, dtype=np.int64), np.asarray(sizes, dtype=np.int64)
    rows = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
    x_path, y_path = row_paths(path)
    x_map, y_map = np.load(x_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")
    try:
        return np.asarray(x_map[rows]), np.asarray(y_map[rows])
    finally:
        del x_map, y_map
