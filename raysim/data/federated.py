"""The federated dataset on disk: train.parquet (rows sorted by client), the server's test.parquet, and
client_sizes.npy (samples per client, memory-mapped by every process that needs them); with
`data.local_test_fraction`, also local_test.parquet and local_test_sizes.npy, each client's held-out rows for
federated evaluation, laid out as the training file.

Both files have the columns `client_id` int64, `x` fixed_size_list<float32 or float64>[prod(feature_shape)]
and `y` (int64 class labels, or float targets: float32/float64, a fixed_size_list for vector targets;
client_id = -1 in the test file), and carry the feature and target shapes in their schema metadata. Row groups are about ROW_GROUP_BYTES and never split a client smaller than that, so a
filtered read of a few clients touches only their row groups.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import json
import math
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysim.data.config import DataConfig
from raysim.data.partition import (NATURAL, apportion_rows, check_min_size, compact_permutation, dense_index, first_per_group,
                                   inverse_permutation, natural_clients_error, partition)
from raysim.core.rng import SERVER, SETUP, stream
from raysim.data.row_store import RowWriter, on_disk
from raysim.data.sources import ClientBlocks, Source, load_blocks, load_source
from raysim.errors import DataError
from raysim.storage.atomic import atomic_write_bytes

ROW_GROUP_BYTES = 1 << 20
WRITE_AHEAD = 64  # row groups queued for the writing thread (64 MB)
TEST_CLIENT = -1
LOCAL_TEST = "local_test.parquet"  # beside train.parquet
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
    description: dict[str, Any] = field(default_factory=dict)  # the source's: its columns and class labels
    local_test_path: Path | None = None  # data.local_test_fraction > 0: each client's held-out rows

    def local_test(self) -> FederatedData | None:
        """The clients' held-out local rows as a dataset of their own (its `train_path` and `client_sizes` those of
        local_test.parquet), read by the shards for federated evaluation; None without `data.local_test_fraction`."""
        if self.local_test_path is None:
            return None
        sizes = np.load(sizes_path(self.local_test_path), mmap_mode="r")
        return replace(self, train_path=self.local_test_path, client_sizes=sizes, num_train=int(np.sum(sizes)),
                       local_test_path=None)

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
            "description": self.description,
            "local_test_path": None if self.local_test_path is None else str(self.local_test_path),
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
            description=dict(d.get("description", {})),
            local_test_path=None if d.get("local_test_path") is None else Path(d["local_test_path"]),
        )


def stratified_holdout(labels: np.ndarray, fraction: float, rng: np.random.Generator,
                       groups: np.ndarray | None = None) -> np.ndarray:
    """Boolean mask of the held-out samples, stratified by label.

    Without `groups`: round(fraction * n) samples (at least one, never all). With `groups`
    (natural clients): floor(fraction * n_g) of each group, stratified by label within it, so
    every group keeps at least (1 - fraction) of its samples.
    """
    n = len(labels)
    if groups is None:
        groups = np.zeros(n, dtype=np.int64)
        totals = np.array([min(max(round(fraction * n), 1), n - 1)])
    else:
        groups = dense_index(groups)
        totals = natural_holdout(np.bincount(groups), fraction)
    return group_holdout(labels, groups, totals, inverse_permutation(compact_permutation(rng, n)))


def natural_holdout(sizes: np.ndarray, fraction: float) -> np.ndarray:
    """Test samples held out of each natural client of `sizes` samples: floor(fraction * n_g)."""
    return np.floor(fraction * sizes).astype(np.int64)


def local_holdout(labels: np.ndarray, owner: np.ndarray, sizes: np.ndarray, fraction: float, pos: np.ndarray) -> np.ndarray:
    """Mask of each client's local test rows (`data.local_test_fraction`) among training rows owned by `owner`
    (dense client indices of `sizes` rows each): floor(fraction * n_c) of client c's, stratified by label, those
    first by `pos` (their places in a keyed permutation) in each (client, label)."""
    return group_holdout(labels, owner, natural_holdout(sizes, fraction), pos)


def group_holdout(labels: np.ndarray, groups: np.ndarray, totals: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Mask of `totals[g]` samples of each group g, apportioned over its labels, those first by `pos` in each
    (group, label). Label values only order the strata, so a block of whole groups gives the pooled mask's part."""
    label_index = dense_index(labels)
    num_labels = int(label_index.max()) + 1 if len(labels) else 1
    strata = groups * num_labels + label_index
    del groups, label_index  # 10^7 samples: 80 MB each, freed before the holdout's own temporaries
    counts = np.bincount(strata, minlength=len(totals) * num_labels).reshape(len(totals), num_labels)
    take = apportion_rows(totals, counts).reshape(-1)
    del counts
    test = np.zeros(len(strata), dtype=bool)
    test[first_per_group(strata, take, pos)] = True
    return test


def _row_group_bounds(runs: np.ndarray, target: int) -> list[int]:
    """Row-group boundaries of about `target` rows for consecutive clients of `runs` rows each that never
    split a client smaller than `target`.

    A group starts at the first client starting in each window of `target` rows; a client larger
    than `target` starts its own groups of `target` rows, and the next client starts a new one.
    """
    sizes = np.asarray(runs, dtype=np.int64)
    starts = np.cumsum(sizes)
    n = int(starts[-1]) if len(starts) else 0
    starts -= sizes  # each client's first row, in place: one array over the clients (10^8 of them at most)
    edges = np.arange(0, n, target)  # each window's first row
    at = np.searchsorted(starts, edges)  # the first client starting at or after it
    inside = at < len(starts)
    firsts = starts[at[inside]]
    big = sizes > target
    parts: list[np.ndarray | list[int]] = [firsts[firsts < edges[inside] + target],  # those starting in their window
                                           starts[big] + sizes[big], [n],
                                           *(np.arange(s, s + m, target) for s, m in zip(starts[big], sizes[big]))]
    return [int(b) for b in np.unique(np.concatenate(parts))]


def _runs(client_id: np.ndarray) -> np.ndarray:
    """The lengths of the runs of equal consecutive client ids."""
    starts = np.flatnonzero(np.diff(client_id, prepend=client_id[:1] - 1))
    return np.diff(starts, append=len(client_id))


def _column(values: np.ndarray, width: int) -> pa.Array:
    """One array per row: a plain column when width is 0 (scalars), else a fixed-size list column."""
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return flat if width == 0 else pa.FixedSizeListArray.from_arrays(flat, width)


class _GroupWriter:
    """A table written atomically (a temporary file in the same folder, then os.replace on a clean exit) from
    rows appended in file order, as row groups of about ROW_GROUP_BYTES that never split a client smaller than
    that (`runs`: the rows of each consecutive client). A thread writes the groups while the caller makes the
    next rows, at most WRITE_AHEAD groups behind: the file is never whole in memory."""

    def __init__(self, path: Path, runs: np.ndarray, meta: dict[str, Any], x_dtype: np.dtype, y_dtype: np.dtype,
                 flat: bool = False):
        """`flat`: also write the rows as flat files (raysim.data.row_store) for shards that read them per round."""
        self.path, self.meta = path, meta
        self.width = math.prod(meta["feature_shape"])
        self.y_width = math.prod(meta["target_shape"]) if meta["target_shape"] else 0
        row_bytes = np.dtype(x_dtype).itemsize * self.width + np.dtype(y_dtype).itemsize * max(self.y_width, 1) + 8
        self.bounds = collections.deque(_row_group_bounds(runs, max(1, ROW_GROUP_BYTES // row_bytes))[1:])
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.written = self.buffered = 0
        empty = self._table(np.empty(0, np.int64), np.empty((0, *meta["feature_shape"]), x_dtype),
                            np.empty((0, *meta["target_shape"]), y_dtype))
        self.tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        self.writer = pq.ParquetWriter(self.tmp, empty.schema, compression="none", use_dictionary=False,
                                       sorting_columns=[pq.SortingColumn(0)])
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="raysim-parquet")
        self.queued: collections.deque[Future] = collections.deque()
        self.flat = RowWriter(path, int(np.sum(runs)), np.empty((0, *meta["feature_shape"]), x_dtype),
                              np.empty((0, *meta["target_shape"]), y_dtype)) if flat else None

    def _table(self, client_id: np.ndarray, x: np.ndarray, y: np.ndarray) -> pa.Table:
        return pa.table({
            "client_id": pa.array(client_id, pa.int64()),
            "x": _column(x, self.width),
            "y": _column(y, self.y_width),
        }).replace_schema_metadata({_META_KEY: json.dumps(self.meta).encode()})

    def append(self, client_id: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """The next rows of the file; every row group they complete is written."""
        self.pending.append((client_id, x, y))
        self.buffered += len(client_id)
        while self.bounds and self.written + self.buffered >= self.bounds[0]:
            rows = self.bounds.popleft() - self.written
            parts = [np.concatenate(c) if len(self.pending) > 1 else self.pending[0][i]
                     for i, c in enumerate(zip(*self.pending))]
            if len(self.queued) >= WRITE_AHEAD:
                self.queued.popleft().result()
            self.queued.append(self.pool.submit(self._write_group, *(p[:rows] for p in parts)))
            self.pending = [tuple(p[rows:] for p in parts)] if len(parts[0]) > rows else []  # type: ignore[list-item]
            self.written, self.buffered = self.written + rows, self.buffered - rows

    def _write_group(self, client_id: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
        """One row group (on the writing thread), and its rows in the flat files."""
        self.writer.write_table(self._table(client_id, x, y), row_group_size=len(client_id))
        if self.flat is not None:
            self.flat.append(x, y)

    def __enter__(self) -> _GroupWriter:
        return self

    def __exit__(self, kind: type | None, *_: Any) -> None:
        try:
            try:
                if kind is None:
                    for done in self.queued:
                        done.result()  # a failed write raises here
                    if self.buffered or self.bounds:
                        raise ValueError(f"{self.path}: rows appended past or short of the row groups")
            finally:
                self.pool.shutdown(cancel_futures=True)
                self.writer.close()
            if kind is None:
                os.replace(self.tmp, self.path)
        finally:
            self.tmp.unlink(missing_ok=True)
            if self.flat is not None:
                self.flat.close(kind is None and self.path.exists())


def _write(path: Path, client_id: np.ndarray, x: np.ndarray, y: np.ndarray, rows: np.ndarray, meta: dict[str, Any],
           flat: bool) -> None:
    """Write one table atomically. `rows` picks the rows of x and y to write, in order, gathered one row group
    at a time, so the written split is never a second copy of the features in memory."""
    with _GroupWriter(path, _runs(client_id), meta, x.dtype, y.dtype, flat) as writer:
        ends = list(writer.bounds)
        for a, b in zip([0, *ends[:-1]], ends):
            writer.append(client_id[a:b], x[rows[a:b]], y[rows[a:b]])


def build_federated(cfg: DataConfig, seed: int, out_dir: Path) -> FederatedData:
    """Load the source, hold out the server's test set, partition the rest, write both Parquet files.

    `data.partition_seed`, when set, replaces `seed` here, so the data stay fixed across experiment seeds.
    """
    seed = cfg.split_seed(seed)
    blocks = load_blocks(cfg, seed) if cfg.partition.kind == NATURAL and cfg.test_split == "holdout" else None
    if blocks is not None:
        return _build_from_blocks(cfg, seed, blocks, Path(out_dir))
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
    _check_train_samples(cfg, num_train, num_test)
    ids = partition(labels[train], cfg.num_clients, cfg.partition, stream(seed, SETUP, SERVER, "partition"),
                    natural=src.natural_clients[train] if natural and src.natural_clients is not None else None)
    rank = inverse_permutation(compact_permutation(stream(seed, SETUP, SERVER, "row_order"), num_train))
    order = np.lexsort((rank, ids))  # by client, then by place in the row-order permutation
    meta = {"feature_shape": list(src.feature_shape), "target_shape": list(src.y.shape[1:])}
    train_path, test_path = _paths(out_dir)
    # the training rows by client, gathered a row group at a time: never a second copy of the features
    flat = on_disk(cfg, num_train, src.feature_shape)
    owner, rows, sizes = ids[order], np.flatnonzero(train)[order], np.bincount(ids, minlength=cfg.num_clients)
    del ids, order
    local_sizes = None
    if cfg.local_test_fraction:
        local = local_holdout(labels[rows], owner, sizes, cfg.local_test_fraction, _local_positions(seed, num_train))
        _check_local(cfg, sizes, int(local.sum()))
        _write(train_path.with_name(LOCAL_TEST), owner[local], src.x, src.y, rows[local], meta, flat)
        owner, rows, local_sizes = owner[~local], rows[~local], np.bincount(owner[local], minlength=cfg.num_clients)
    _write(train_path, owner, src.x, src.y, rows, meta, flat)
    _write(test_path, np.full(num_test, TEST_CLIENT, dtype=np.int64), src.x, src.y, np.flatnonzero(test), meta, flat)
    return _finish(cfg, train_path, test_path, sizes, meta, num_test, src.num_classes, src.image_shape, src.description,
                   local_sizes)


def _build_from_blocks(cfg: DataConfig, seed: int, src: ClientBlocks, out_dir: Path) -> FederatedData:
    """build_federated of a natural source made a block of clients at a time: the same files, bit for bit, with
    no pooled copy of the samples. A sample's holdout and its row's place depend only on its client's samples
    and its positions in the test-split and row-order permutations, which are drawn up front from the sizes."""
    sizes = np.asarray(src.sizes, dtype=np.int64)
    if len(sizes) != cfg.num_clients or not sizes.all():
        raise natural_clients_error(int(np.count_nonzero(sizes)), cfg.num_clients)
    train_sizes = sizes - natural_holdout(sizes, cfg.test_fraction)  # a block's held-out counts made again per block
    num_train = int(train_sizes.sum())
    num_test = int(sizes.sum()) - num_train
    _check_train_samples(cfg, num_train, num_test)
    check_min_size(train_sizes, cfg.partition)
    local_sizes = natural_holdout(train_sizes, cfg.local_test_fraction) if cfg.local_test_fraction else None
    if local_sizes is not None:
        _check_local(cfg, train_sizes, int(local_sizes.sum()))
    pos = inverse_permutation(compact_permutation(stream(seed, SETUP, SERVER, "test_split"), int(sizes.sum())))
    rank = inverse_permutation(compact_permutation(stream(seed, SETUP, SERVER, "row_order"), num_train))
    local_pos = _local_positions(seed, num_train) if local_sizes is not None else None
    blocks = iter(src.blocks)
    a, b, x, y = next(blocks)
    meta, dtypes = {"feature_shape": list(src.feature_shape), "target_shape": list(y.shape[1:])}, (x.dtype, y.dtype)
    train_path, test_path = _paths(out_dir)
    flat = on_disk(cfg, num_train, tuple(src.feature_shape))
    with contextlib.ExitStack() as files:
        runs = train_sizes if local_sizes is None else train_sizes - local_sizes  # the training file's rows a client
        train = files.enter_context(_GroupWriter(train_path, runs, meta, *dtypes, flat))
        del runs  # an array over every client: not held through the blocks
        test = files.enter_context(_GroupWriter(test_path, np.array([num_test]), meta, *dtypes, flat))
        local = None if local_sizes is None else files.enter_context(
            _GroupWriter(train_path.with_name(LOCAL_TEST), local_sizes[local_sizes > 0], meta, *dtypes, flat))
        end = first = train_first = 0  # the next client, its first sample and its first training row
        for a, b, x, y in itertools.chain([(a, b, x, y)], blocks):
            if a != end:
                raise ValueError(f"source {cfg.source!r}: a block of clients starts at {a}, not at {end}: "
                                 f"blocks must hold every client once, in order")
            last, train_last = first + int(sizes[a:b].sum()), train_first + int(train_sizes[a:b].sum())
            owner = np.repeat(np.arange(b - a), sizes[a:b])
            Source(x, y, src.feature_shape, src.num_classes)  # each block checked as a whole source would be
            if len(y) != len(owner) or x.dtype != dtypes[0] or y.dtype != dtypes[1]:
                raise ValueError(f"source {cfg.source!r}: the block of clients {a}..{b - 1} has {len(y)} samples of "
                                 f"{x.dtype}/{y.dtype}; its sizes say {len(owner)}, the first block {dtypes[0]}/{dtypes[1]}")
            labels = np.zeros(len(y), dtype=np.int64) if src.num_classes == 0 else y
            out = group_holdout(labels, owner, sizes[a:b] - train_sizes[a:b], pos[first:last])
            rows = np.flatnonzero(~out)
            rows = rows[np.lexsort((rank[train_first:train_last], owner[rows]))]  # by client, then row order
            if local is not None and local_pos is not None:
                mask = local_holdout(labels[rows], owner[rows], train_sizes[a:b], cfg.local_test_fraction,
                                     local_pos[train_first:train_last])
                local.append(owner[rows[mask]] + a, x[rows[mask]], y[rows[mask]])
                rows = rows[~mask]
            train.append(owner[rows] + a, x[rows], y[rows])
            rows = np.flatnonzero(out)
            test.append(np.full(len(rows), TEST_CLIENT, dtype=np.int64), x[rows], y[rows])
            end, first, train_first = b, last, train_last
    del pos, rank, local_pos  # the permutations over every sample: not held while the sizes are written
    return _finish(cfg, train_path, test_path, train_sizes, meta, num_test, src.num_classes, src.image_shape,
                   local_sizes=local_sizes)


def _check_train_samples(cfg: DataConfig, num_train: int, num_test: int) -> None:
    """DataError naming data.num_clients when the training samples cannot give every client min_size."""
    need = cfg.num_clients * cfg.partition.min_size
    if num_train < need:
        raise DataError(
            f"data.num_clients: {cfg.num_clients} clients x data.partition.min_size={cfg.partition.min_size} "
            f"need {need} training samples, but source {cfg.source!r} has {num_train + num_test} samples of which "
            f"{num_test} are held out for testing, leaving {num_train}")


def _local_positions(seed: int, num_train: int) -> np.ndarray:
    """Each training row's place (in file order) in the keyed permutation that picks the local test rows."""
    return inverse_permutation(compact_permutation(stream(seed, SETUP, SERVER, "local_test_split"), num_train))


def _check_local(cfg: DataConfig, sizes: np.ndarray, held: int) -> None:
    """DataError naming data.local_test_fraction when it holds out no client's row (floor(fraction * n) = 0)."""
    if cfg.local_test_fraction and not held:
        raise DataError(f"data.local_test_fraction: {cfg.local_test_fraction} holds out no sample of any client "
                        f"(floor(fraction x samples) is 0 for clients of at most {int(np.max(sizes))} samples); raise it")


def _paths(out_dir: Path) -> tuple[Path, Path]:
    """train.parquet and test.parquet in `out_dir`, created."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return out_dir / "train.parquet", out_dir / "test.parquet"


def _finish(cfg: DataConfig, train_path: Path, test_path: Path, sizes: np.ndarray, meta: dict[str, Any], num_test: int,
            num_classes: int, image_shape: tuple[int, ...] | None, description: dict[str, Any] | None = None,
            local_sizes: np.ndarray | None = None) -> FederatedData:
    """Write the client sizes beside the training file (`sizes`: before the local test split; `local_sizes`, each
    client's local test rows, beside local_test.parquet); what was built (and how the source read it)."""
    local_path = None
    if local_sizes is not None:
        local_path = train_path.with_name(LOCAL_TEST)
        local = np.asarray(local_sizes, dtype=np.int64)
        atomic_write_bytes(sizes_path(local_path), lambda tmp: _save_npy(tmp, local))
        sizes = sizes - local
    sizes = np.asarray(sizes, dtype=np.int64)
    atomic_write_bytes(sizes_path(train_path), lambda tmp: _save_npy(tmp, sizes))
    return FederatedData(
        train_path=train_path,
        test_path=test_path,
        num_clients=cfg.num_clients,
        client_sizes=sizes,
        feature_shape=tuple(meta["feature_shape"]),
        image_shape=image_shape,
        num_classes=num_classes,
        num_train=int(sizes.sum()),
        num_test=num_test,
        target_shape=tuple(meta["target_shape"]),
        description=description or {},
        local_test_path=local_path,
    )


def sizes_path(train_path: Path) -> Path:
    """Where the client sizes of the dataset whose training file is `train_path` lie (.npy, beside it):
    client_sizes.npy for train.parquet, local_test_sizes.npy for local_test.parquet."""
    return train_path.with_name("client_sizes.npy" if train_path.name == "train.parquet" else f"{train_path.stem}_sizes.npy")


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


def _shapes(schema: pa.Schema) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(feature_shape, target_shape) from the file's metadata."""
    meta = json.loads(schema.metadata[_META_KEY])
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
    x[offsets[i]:offsets[i + 1]] in file order (ids sorted). Row groups whose client_id statistics miss the ids
    are skipped, and those inside a contiguous run of ids are read whole; the others are read one at a time into
    arrays sized from a first pass over their client_id column, so 500,000 clients (a shard) take their own rows'
    memory and one row group's, with no Python object per client. Raises KeyError for a client with no rows."""
    if isinstance(client_ids, range) and client_ids.step == 1:  # a shard's clients: sorted and distinct already
        ids = np.arange(client_ids.start, client_ids.stop, dtype=np.int64)
    else:
        ids = np.unique(np.asarray(list(client_ids), dtype=np.int64))
    lo, hi = (int(ids[0]), int(ids[-1])) if ids.size else (0, -1)
    run = len(ids) == hi - lo + 1
    file = pq.ParquetFile(path)
    picks: list[tuple[int, np.ndarray | None]] = []
    for g in range(file.num_row_groups):
        stats = file.metadata.row_group(g).column(0).statistics
        known = stats is not None and stats.has_min_max
        if known and (stats.max < lo or stats.min > hi):
            continue
        if known and run and lo <= stats.min and stats.max <= hi:
            picks.append((g, None))  # every row is wanted: its client_id column is decoded once, with the rest
            continue
        cid = file.read_row_group(g, columns=["client_id"]).column(0).to_numpy()
        keep = (cid >= lo) & (cid <= hi) if run else np.isin(cid, ids)
        if keep.any():
            picks.append((g, keep))
    cid, x, y = _read_groups(file, picks)
    if np.any(np.diff(cid) < 0):  # a stable sort keeps each client's rows in file order
        order = np.argsort(cid, kind="stable")
        cid, x, y = cid[order], x[order], y[order]
    counts = np.bincount(cid - lo if run else np.searchsorted(ids, cid), minlength=len(ids))
    if np.any(counts == 0):
        raise KeyError(f"clients {ids[counts == 0].tolist()} have no rows in {path}")
    return ids, np.concatenate([[0], np.cumsum(counts)]), x, y


def _read_groups(file: pq.ParquetFile, picks: list[tuple[int, np.ndarray | None]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(client_id, x, y) of the rows `mask` (None: all) of each row group `g` of `picks`, in that order, read a
    group at a time into arrays allocated once: a read holds its rows and one row group, never a second copy."""
    counts = [file.metadata.row_group(g).num_rows if keep is None else int(keep.sum()) for g, keep in picks]
    cid, x, y = (np.empty((sum(counts), *a.shape[1:]), a.dtype) for a in _table_arrays(file.schema_arrow.empty_table()))
    at = 0
    for (g, keep), rows in zip(picks, counts):
        parts = _table_arrays(file.read_row_group(g))
        for into, part in zip((cid, x, y), parts):
            into[at:at + rows] = part if keep is None else part[keep]
        at += rows
    pa.default_memory_pool().release_unused()  # the row groups' pages go back to the system, not to Arrow's cache
    return cid, x, y


def _table_arrays(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(client_id, x, y) of every row of `table` (a row group), in its order; x of shape (n, *feature_shape)."""
    shapes = _shapes(table.schema)
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
    file = pq.ParquetFile(path)
    _, x, y = _read_groups(file, [(g, None) for g in range(file.num_row_groups)])
    return x, y


def read_rows(path: str | Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows` (sorted, distinct file positions) of a file as (x, y), read a row group at a time: a sample of
    a large file never holds more of it than one row group beside the rows kept."""
    file = pq.ParquetFile(path)
    ends = np.cumsum([0] + [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)])
    bounds = np.searchsorted(rows, ends)  # group g holds rows[bounds[g]:bounds[g + 1]]
    picks: list[tuple[int, np.ndarray | None]] = []
    for g in np.flatnonzero(np.diff(bounds)):
        keep = np.zeros(ends[g + 1] - ends[g], dtype=bool)
        keep[rows[bounds[g]:bounds[g + 1]] - ends[g]] = True
        picks.append((int(g), keep))
    _, x, y = _read_groups(file, picks)
    return x, y
