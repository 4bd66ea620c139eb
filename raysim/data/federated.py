"""The federated dataset on disk: train.parquet (rows sorted by client), the server's test.parquet, and
client_sizes.npy (samples per client, memory-mapped by every process that needs them).

Both files have the columns `client_id` int64, `x` fixed_size_list<float32 or float64>[prod(feature_shape)]
and `y` (int64 class labels, or float targets: float32/float64, a fixed_size_list for vector targets;
client_id = -1 in the test file), and carry the feature and target shapes in their schema metadata. Row groups are about ROW_GROUP_BYTES and never split a client smaller than that, so a
filtered read of a few clients touches only their row groups.
"""
from __future__ import annotations

import json
import math
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysim.data.config import DataConfig
from raysim.data.partition import NATURAL, apportion_rows, dense_index, partition, sample_per_group
from raysim.data.sources import load_source
from raysim.errors import DataError
from raysim.atomic import atomic_write_bytes
from raysim.rng import SERVER, SETUP, stream

ROW_GROUP_BYTES = 1 << 20
TEST_CLIENT = -1
_META_KEY = b"raysim"
LABEL_PARTITIONERS = ("dirichlet", "dirichlet_classes", "shards")  # need class labels: not for regression sources


@dataclass
class FederatedData:
    """Where a built federated dataset lies and what it holds; `client_sizes[c]` = samples of client c.

    `num_classes` is 0 for regression (float targets of shape `target_shape` per sample).
    """

    train_path: Path
    test_path: Path
    num_clients: int
    client_sizes: np.ndarray
    feature_shape: tuple[int, ...]
    image_shape: tuple[int, ...] | None
    num_classes: int
    num_train: int
    num_test: int
    target_shape: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain Python values only (str, int, list), e.g. to send to actors or write as JSON; the
        client sizes stay in `sizes_path(train_path)` (a million clients would make this 10 MB)."""
        return {
            "train_path": str(self.train_path),
            "test_path": str(self.test_path),
            "num_clients": self.num_clients,
            "feature_shape": list(self.feature_shape),
            "image_shape": None if self.image_shape is None else list(self.image_shape),
            "num_classes": self.num_classes,
            "num_train": self.num_train,
            "num_test": self.num_test,
            "target_shape": list(self.target_shape),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FederatedData:
        """Inverse of `to_dict`; the client sizes are memory-mapped (read-only, one copy per machine)."""
        train_path = Path(d["train_path"])
        return cls(
            train_path=train_path,
            test_path=Path(d["test_path"]),
            num_clients=int(d["num_clients"]),
            client_sizes=np.load(sizes_path(train_path), mmap_mode="r"),
            feature_shape=tuple(d["feature_shape"]),
            image_shape=None if d["image_shape"] is None else tuple(d["image_shape"]),
            num_classes=int(d["num_classes"]),
            num_train=int(d["num_train"]),
            num_test=int(d["num_test"]),
            target_shape=tuple(d.get("target_shape", ())),
        )


def stratified_holdout(labels: np.ndarray, fraction: float, rng: np.random.Generator,
                       groups: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of the held-out samples, stratified by label.

    Without `groups`: round(fraction * n) samples (at least one, never all). With `groups`
    (natural clients): floor(fraction * n_g) of each group, stratified by label within it, so
    every group keeps at least (1 - fraction) of its samples.
    """
    n = len(labels)
    label_index = dense_index(labels)
    if groups is None:
        groups = np.zeros(n, dtype=np.int64)
        totals = np.array([min(max(round(fraction * n), 1), n - 1)])
    else:
        groups = dense_index(groups)
        totals = np.floor(fraction * np.bincount(groups)).astype(np.int64)
    num_labels = int(label_index.max()) + 1
    strata = groups * num_labels + label_index
    del groups, label_index  # 10^7 samples: 80 MB each, freed before the holdout's own temporaries
    counts = np.bincount(strata, minlength=len(totals) * num_labels).reshape(len(totals), num_labels)
    take = apportion_rows(totals, counts).reshape(-1)
    del counts
    test = np.zeros(n, dtype=bool)
    test[sample_per_group(strata, take, rng)] = True
    return test


def _row_group_bounds(client_id: np.ndarray, target: int) -> list[int]:
    """Row-group boundaries of about `target` rows that never split a client smaller than `target`.

    A group starts at the first client starting in each window of `target` rows; a client larger
    than `target` starts its own groups of `target` rows, and the next client starts a new one.
    """
    n = len(client_id)
    starts = np.flatnonzero(np.diff(client_id, prepend=client_id[:1] - 1))
    sizes = np.diff(starts, append=n)
    big = sizes > target
    parts: list[np.ndarray | list[int]] = [starts[np.unique(starts // target, return_index=True)[1]], starts[big] + sizes[big], [n],
             *(np.arange(s, s + m, target) for s, m in zip(starts[big], sizes[big]))]
    return [int(b) for b in np.unique(np.concatenate(parts))]


def _column(values: np.ndarray, width: int) -> pa.Array:
    """One array per row: a plain column when width is 0 (scalars), else a fixed-size list column."""
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return flat if width == 0 else pa.FixedSizeListArray.from_arrays(flat, width)


def _write(path: Path, client_id: np.ndarray, x: np.ndarray, y: np.ndarray, rows: np.ndarray, meta: dict[str, Any]) -> None:
    """Write one table atomically: a temporary file in the same folder, then os.replace. `rows` picks the
    rows of x and y to write, in order, gathered one row group at a time, so the written split is never a
    second copy of the features in memory."""
    width = math.prod(meta["feature_shape"])
    y_width = math.prod(meta["target_shape"]) if meta["target_shape"] else 0

    def group(a: int, b: int) -> pa.Table:
        take = rows[a:b]
        return pa.table({
            "client_id": pa.array(client_id[a:b], pa.int64()),
            "x": _column(x[take], width),
            "y": _column(y[take], y_width),
        }).replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})

    row_bytes = x.itemsize * width + y.itemsize * max(y_width, 1) + 8
    bounds = _row_group_bounds(client_id, max(1, ROW_GROUP_BYTES // row_bytes))
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with pq.ParquetWriter(tmp, group(0, 0).schema, compression="none", use_dictionary=False,
                              sorting_columns=[pq.SortingColumn(0)]) as writer:
            for a, b in zip(bounds[:-1], bounds[1:]):
                writer.write_table(group(a, b), row_group_size=b - a)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def build_federated(cfg: DataConfig, seed: int, out_dir: Path) -> FederatedData:
    """Load the source, hold out the server's test set, partition the rest, write both Parquet files.

    `data.partition_seed`, when set, replaces `seed` here, so the data stay fixed across experiment seeds.
    """
    seed = cfg.split_seed(seed)
    src = load_source(cfg, seed)
    natural = cfg.partition.kind == NATURAL
    if natural and src.natural_clients is None:
        raise DataError(f"data.source {cfg.source!r} is registered as natural but gave no client ids (Source.natural_clients)")
    if src.regression and cfg.partition.kind in LABEL_PARTITIONERS:
        raise DataError(f"data.partition.kind: {cfg.partition.kind!r} skews class labels, but source "
                         f"{cfg.source!r} has float targets; use iid, quantity or natural")
    labels = np.zeros(len(src.y), dtype=np.int64) if src.regression else src.y
    if cfg.test_split == "source":
        if src.test_mask is None:
            raise DataError(f"data.test_split: source {cfg.source!r} has no test split of its own; "
                             f"use 'holdout' (allowed: holdout, source)")
        test = src.test_mask
    else:
        test = stratified_holdout(labels, cfg.test_fraction, stream(seed, SETUP, SERVER, "test_split"),
                                  src.natural_clients if natural else None)
    train = ~test
    num_train, num_test = int(train.sum()), int(test.sum())
    need = cfg.num_clients * cfg.partition.min_size
    if num_train < need:
        raise DataError(
            f"data.num_clients: {cfg.num_clients} clients x data.partition.min_size={cfg.partition.min_size} "
            f"need {need} training samples, but source {cfg.source!r} has {len(src.y)} samples of which "
            f"{num_test} are held out for testing, leaving {num_train}")
    ids = partition(labels[train], cfg.num_clients, cfg.partition, stream(seed, SETUP, SERVER, "partition"),
                    natural=src.natural_clients[train] if natural and src.natural_clients is not None else None)
    shuffled = stream(seed, SETUP, SERVER, "row_order").permutation(num_train)
    order = shuffled[np.argsort(ids[shuffled], kind="stable")]  # by client, random within a client
    meta = {"feature_shape": list(src.feature_shape), "target_shape": list(src.y.shape[1:])}
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    train_path, test_path = out_dir / "train.parquet", out_dir / "test.parquet"
    # the training rows by client, gathered a row group at a time: never a second copy of the features
    _write(train_path, ids[order], src.x, src.y, np.flatnonzero(train)[order], meta)
    _write(test_path, np.full(num_test, TEST_CLIENT, dtype=np.int64), src.x, src.y, np.flatnonzero(test), meta)
    sizes = np.bincount(ids, minlength=cfg.num_clients).astype(np.int64)
    atomic_write_bytes(sizes_path(train_path), lambda tmp: _save_npy(tmp, sizes))
    return FederatedData(
        train_path=train_path,
        test_path=test_path,
        num_clients=cfg.num_clients,
        client_sizes=sizes,
        feature_shape=tuple(src.feature_shape),
        image_shape=src.image_shape,
        num_classes=src.num_classes,
        num_train=num_train,
        num_test=num_test,
        target_shape=tuple(src.y.shape[1:]),
    )


def sizes_path(train_path: Path) -> Path:
    """Where the client sizes of the dataset whose training file is `train_path` lie (.npy, beside it)."""
    return train_path.with_name("client_sizes.npy")


def _save_npy(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:  # through a file object: np.save would add ".npy" to a bare temporary name
        np.save(f, array)


def _batch_arrays(batch: pa.RecordBatch, shapes: tuple[tuple[int, ...], tuple[int, ...]]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(client_id, x, y) of one record batch as zero-copy, read-only numpy views."""
    feature_shape, target_shape = shapes
    cid = batch.column("client_id").to_numpy()
    x = batch.column("x").flatten().to_numpy().reshape(-1, *feature_shape)
    y = batch.column("y")
    y = y.flatten().to_numpy().reshape(-1, *target_shape) if target_shape else y.to_numpy()
    return cid, x, y


def _shapes(table: pa.Table) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(feature_shape, target_shape) from the file's metadata."""
    meta = json.loads(table.schema.metadata[_META_KEY])
    return tuple(meta["feature_shape"]), tuple(meta.get("target_shape", ()))


def read_clients(path: str | Path, client_ids: Iterable[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{client: (x, y)} for exactly the requested clients, in the order asked (`read_client_block`, split
    per client). x has shape (n_c, *feature_shape) in the stored dtype; y holds int64 labels or float
    targets of shape (n_c, *target_shape); both are read-only views of the one block read for them all.
    Raises KeyError for a client with no rows in the file.
    """
    ids, offsets, x, y = read_client_block(path, client_ids)
    x.flags.writeable = y.flags.writeable = False
    at = {int(c): i for i, c in enumerate(ids)}
    return {c: (x[offsets[at[c]]:offsets[at[c] + 1]], y[offsets[at[c]]:offsets[at[c] + 1]])
            for c in dict.fromkeys(int(c) for c in client_ids)}


def read_client_block(path: str | Path, client_ids: Iterable[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, offsets, x, y): exactly the requested clients as one block of rows, client ids[i]'s rows being
    x[offsets[i]:offsets[i + 1]] in file order (ids sorted). The filter on client_id prunes the other row
    groups: for a run of ids (a shard) a range, so 500,000 clients are read in one pass with no Python object
    per client; for scattered ids their list. Raises KeyError for a client with no rows in the file."""
    ids = np.unique(np.asarray(list(client_ids), dtype=np.int64))
    lo, hi = (int(ids[0]), int(ids[-1])) if ids.size else (0, -1)
    wanted = [("client_id", ">=", lo), ("client_id", "<=", hi)] if len(ids) == hi - lo + 1 else [("client_id", "in", ids.tolist())]
    table = pq.read_table(path, filters=wanted, memory_map=True)
    cid, x, y = _table_arrays(table)
    del table
    pa.default_memory_pool().release_unused()  # the decoded table's pages go back to the system, not to Arrow's cache
    if np.any(np.diff(cid) < 0):  # a stable sort keeps each client's rows in file order
        order = np.argsort(cid, kind="stable")
        cid, x, y = cid[order], x[order], y[order]
    counts = np.bincount(np.searchsorted(ids, cid), minlength=len(ids))
    if np.any(counts == 0):
        raise KeyError(f"clients {ids[counts == 0].tolist()} have no rows in {path}")
    return ids, np.concatenate([[0], np.cumsum(counts)]), x, y


def _table_arrays(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(client_id, x, y) of every row of `table`, in its order; x of shape (n, *feature_shape). One copy out of
    the (memory-mapped) batches into arrays of our own: no combined Arrow table beside them, which Arrow's
    allocator would keep hold of after it is freed."""
    shapes = _shapes(table)
    parts = [_batch_arrays(batch, shapes) for batch in table.to_batches() if len(batch)]
    if not parts:
        x_type, y_type = table.schema.field("x").type.value_type, table.schema.field("y").type
        y_type = getattr(y_type, "value_type", y_type)
        return (np.empty(0, dtype=np.int64), np.empty((0, *shapes[0]), dtype=x_type.to_pandas_dtype()),
                np.empty((0, *shapes[1]), dtype=y_type.to_pandas_dtype()))
    cid, x, y = (np.concatenate([p[i] for p in parts]) for i in range(3))
    return cid, x, y


def read_table_arrays(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """All rows of a file as (x, y), in file order; x of shape (n, *feature_shape)."""
    _, x, y = _table_arrays(pq.read_table(path, memory_map=True))
    return x, y


def read_rows(path: str | Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows` (sorted file positions) of a file as (x, y), read a row group at a time: a sample of
    a large file never holds more of it than one row group beside the rows kept."""
    file = pq.ParquetFile(path, memory_map=True)
    ends = np.cumsum([0] + [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)])
    bounds = np.searchsorted(rows, ends)  # group g holds rows[bounds[g]:bounds[g + 1]]
    _, x, y = _table_arrays(file.schema_arrow.empty_table())
    parts = [(x, y)]
    for g in np.flatnonzero(np.diff(bounds)):
        _, x, y = _table_arrays(file.read_row_group(g))
        local = rows[bounds[g]:bounds[g + 1]] - ends[g]
        parts.append((x[local], y[local]))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
