"""Data sources: each turns the `data:` config and a seed into one pooled labelled dataset.

A source is `f(cfg, seed) -> Source`, registered with `@register_source("name")`; pass
`natural=True` when it assigns samples to clients itself (`partition.kind: natural`).
Nothing here downloads: digits ships with scikit-learn, mnist1d and synthetic are generated.
"""
from __future__ import annotations

import itertools
import math
import random
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from raysim.core.rng import SERVER, SETUP, stream
from raysim.data.columns import features, first_non_finite, is_feature
from raysim.data.partition import NATURAL, apportion
from raysim.errors import DataError
from raysim.plugins import SOURCES

if TYPE_CHECKING:
    from raysim.data.config import DataConfig


FLOATS = (np.float32, np.float64)


@dataclass
class Source:
    """A pooled dataset: features (float32 or float64, shape (n, *feature_shape)) and targets.

    Classification (`num_classes` >= 1): int64 labels in [0, num_classes). Regression or soft
    targets (`num_classes` = 0): float32/float64 targets of shape (n,) or (n, *target_shape).
    `natural_clients` is the source's own client id (0..K-1) of each sample, or None;
    `image_shape` is the (channels, *spatial) view of one sample for CNNs, or None.
    `test_mask` marks the source's own test samples (its official split), or is None.
    """

    x: np.ndarray
    y: np.ndarray
    feature_shape: tuple[int, ...]
    num_classes: int
    natural_clients: np.ndarray | None = None
    image_shape: tuple[int, ...] | None = None
    test_mask: np.ndarray | None = None
    description: dict[str, Any] = field(default_factory=dict)  # how it read its file: columns, class labels

    def __post_init__(self) -> None:
        n = len(self.y)
        if self.x.dtype not in FLOATS or self.x.shape != (n, *self.feature_shape):
            raise ValueError(f"source x must be float32 or float64 of shape {(n, *self.feature_shape)}, "
                             f"got {self.x.dtype} {self.x.shape}")
        row = first_non_finite(self.x)
        if row is not None:  # a NaN feature would show as a diverged run, blamed on the learning rate
            raise DataError(f"data.source: sample {row} has a NaN or infinite feature; features must be finite numbers")
        if self.regression:
            if self.y.dtype not in FLOATS or not np.isfinite(self.y).all():
                raise ValueError("source y of a regression source (num_classes 0) must be finite float32/float64")
        elif self.y.dtype != np.int64 or self.y.ndim != 1 or (
                n and not 0 <= self.y.min() <= self.y.max() < self.num_classes):
            raise ValueError(f"source y must be int64 labels in [0, {self.num_classes})")
        if self.natural_clients is not None and self.natural_clients.shape != (n,):
            raise ValueError("source natural_clients must have one client id per sample")
        if self.test_mask is not None and (self.test_mask.dtype != bool or self.test_mask.shape != (n,)):
            raise ValueError("source test_mask must be a boolean per sample")

    @property
    def regression(self) -> bool:
        """True for float targets (num_classes 0): no label stratification or label-skew partitions."""
        return self.num_classes == 0


@dataclass
class ClientBlocks:
    """A natural source made a block of consecutive clients at a time, so that a build never pools its samples.

    Client k has `sizes[k]` samples; `blocks` yields (first client, end client, x, y) in client order, every
    client once, x and y as a Source's; it is read once. `pooled()` is the same data as one Source.
    """

    sizes: np.ndarray
    feature_shape: tuple[int, ...]
    num_classes: int
    blocks: Iterable[tuple[int, int, np.ndarray, np.ndarray]]
    image_shape: tuple[int, ...] | None = None

    def pooled(self) -> Source:
        """Every block in one Source, each sample's natural client from `sizes`."""
        first = np.concatenate([[0], np.cumsum(self.sizes)])
        blocks = iter(self.blocks)
        head = next(blocks)
        x, y = (np.empty((int(first[-1]), *a.shape[1:]), a.dtype) for a in head[2:])
        for a, b, xb, yb in itertools.chain([head], blocks):
            x[first[a]:first[b]], y[first[a]:first[b]] = xb, yb
        clients = np.repeat(np.arange(len(self.sizes), dtype=np.int64), self.sizes)
        return Source(x, y, self.feature_shape, self.num_classes, natural_clients=clients, image_shape=self.image_shape)


SourceLoader = Callable[["DataConfig", int], Source]
BlockLoader = Callable[["DataConfig", int], ClientBlocks]
SourceCheck = Callable[["DataConfig"], object]
SourceCount = Callable[["DataConfig"], int]


def register_source(name: str, natural: bool = False, options: type | None = None,
                    check: SourceCheck | None = None, replace: bool = False,
                    count: SourceCount | None = None) -> Callable[[SourceLoader], SourceLoader]:
    """Decorator: make `f(cfg, seed) -> Source` available as `data.source: name`; `natural` when the
    source assigns its samples to clients itself (`partition.kind: natural`); `options`, a pydantic
    model of the source's own parameters (`data.options:`, read with `cfg.source_options()`); `check(cfg)`,
    what the source can find wrong cheaply (a missing file or column), raising DataError before Ray starts;
    `replace`, to take the name of another module's source (a built-in's), which is refused otherwise;
    `count(cfg)`, how many natural clients it holds, read cheaply, so a config may leave data.num_clients out."""

    def wrap(fn: SourceLoader) -> SourceLoader:
        fn.natural = natural  # type: ignore[attr-defined]
        fn.options = options  # type: ignore[attr-defined]
        fn.check = check  # type: ignore[attr-defined]
        fn.count = count  # type: ignore[attr-defined]
        SOURCES.add(name, fn, replace)
        return fn

    return wrap


def register_block_source(name: str, options: type | None = None, check: SourceCheck | None = None,
                          replace: bool = False) -> Callable[[BlockLoader], BlockLoader]:
    """Decorator: make `f(cfg, seed) -> ClientBlocks`, a natural source made a block of clients at a time,
    available as `data.source: name`; a build under the natural partition then never pools its samples."""

    def wrap(fn: BlockLoader) -> BlockLoader:
        def pooled(cfg: DataConfig, seed: int) -> Source:
            return fn(cfg, seed).pooled()

        pooled.__doc__ = fn.__doc__
        pooled.blocks = fn  # type: ignore[attr-defined]
        pooled.__wrapped__ = fn  # type: ignore[attr-defined]  # whose source it is (plugins._code)
        register_source(name, natural=True, options=options, check=check, replace=replace)(pooled)
        return fn

    return wrap


def check_source(cfg: DataConfig) -> None:
    """The source's own quick check of `data:` (see `register_source`): a run makes it before Ray starts,
    so a missing file is one line at once, not after Ray's start-up; the build finds everything else."""
    check = getattr(SOURCES.lookup(cfg.source), "check", None)
    if check is not None:
        check(cfg)


def load_blocks(cfg: DataConfig, seed: int) -> ClientBlocks | None:
    """The clients of `cfg.source` a block at a time, or None for a source registered whole."""
    blocks = getattr(SOURCES.lookup(cfg.source), "blocks", None)
    return None if blocks is None else blocks(cfg, seed)


def is_natural(name: str) -> bool:
    """True if source `name` assigns samples to clients itself."""
    return bool(getattr(SOURCES.lookup(name), "natural", False))


def natural_sources() -> list[str]:
    """The registered sources that assign samples to clients."""
    return [n for n in SOURCES.names() if is_natural(n)]


def natural_count(cfg: DataConfig) -> int | None:
    """How many natural clients `cfg.source` holds, where it can tell before it loads (None where it cannot)."""
    count = getattr(SOURCES.lookup(cfg.source), "count", None)
    return None if count is None else int(count(cfg))


def load_source(cfg: DataConfig, seed: int) -> Source:
    """The pooled dataset of `cfg.source`."""
    return SOURCES.lookup(cfg.source)(cfg, seed)


@register_source("digits")
def digits(cfg: DataConfig, seed: int) -> Source:
    """scikit-learn's bundled 8x8 digits (1797 samples, 10 classes), pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype(np.float32)
    return Source(x, data.target.astype(np.int64), (64,), 10, image_shape=(1, 8, 8))


@contextmanager
def _global_rng_restored() -> Iterator[None]:
    """Restore numpy's and Python's global RNG state afterwards (for libraries that reseed them)."""
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


class MNIST1DOptions(BaseModel):
    """`data.options` of mnist1d: the generator's seed."""

    model_config = ConfigDict(extra="forbid")

    seed: int | None = Field(None, ge=0, description="make_dataset's seed (42: the package's default, its published "
                                                      "set); None: drawn from the data seed's stream")


MNIST1D_TRAIN_SPLIT = 0.8  # the package's default: its last 20% of samples are its test set


@register_source("mnist1d", options=MNIST1DOptions)
def mnist1d(cfg: DataConfig, seed: int) -> Source:
    """MNIST-1D from the package's procedural generator (never its download path): 40 features, 10 classes.

    The generator reseeds and draws from numpy's global RNG; its seed is `data.options.seed` or comes from
    our stream, and the global state is restored afterwards. `test_split: source` takes the package's own
    split (the last 20% of its shuffled samples).
    """
    from mnist1d.data import get_dataset_args, make_dataset
    from mnist1d.utils import ObjectView

    args = get_dataset_args(as_dict=True)
    del args["url"]  # make_dataset never downloads; without the URL nothing could
    options = cfg.source_options()
    assert isinstance(options, MNIST1DOptions)
    fixed = options.seed
    args.update(num_samples=cfg.mnist1d_samples, train_split=MNIST1D_TRAIN_SPLIT,
                seed=int(stream(seed, SETUP, SERVER, "mnist1d").integers(2**31)) if fixed is None else fixed)
    with _global_rng_restored():
        data = make_dataset(ObjectView(args))
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    test = np.arange(len(y)) >= len(data["y"])
    return Source(x, y, x.shape[1:], 10, image_shape=(1, *x.shape[1:]), test_mask=test)


@register_block_source("synthetic")
def synthetic(cfg: DataConfig, seed: int) -> ClientBlocks:
    """Synthetic(alpha, beta) of the FedProx paper (Li et al. 2020): per-client softmax regression.

    Client k: u_k ~ N(0, alpha^2) per class, W_k ~ N(u_k, 1), b_k ~ N(u_k, 1); B_k ~ N(0, beta^2),
    v_k ~ N(B_k, 1), x ~ N(v_k, diag(j^-1.2)), y = argmax(W_k^T x + b_k). Client sizes follow the
    reference code's lognormal(4, 2) + 50, scaled to `synthetic_samples`. The reference code draws
    u_k as one scalar, which shifts every logit equally and so never changes a label; drawing it
    per class makes alpha act (alpha = 0 is unchanged). Each client gets enough samples to keep
    `partition.min_size` after its share of the test set is held out.
    """
    rng = stream(seed, SETUP, SERVER, "synthetic")
    k, d, c = cfg.num_clients, cfg.synthetic_features, cfg.synthetic_classes
    minimum = math.ceil(cfg.partition.min_size / (1 - cfg.test_fraction))
    if cfg.synthetic_samples < k * minimum:
        raise DataError(f"data.synthetic_samples: {cfg.synthetic_samples} samples cannot give "
                         f"data.num_clients={k} clients {minimum} samples each")
    sizes = apportion(cfg.synthetic_samples, rng.lognormal(4.0, 2.0, k) + 50.0, minimum)
    # the stream holds every u_k, then every B_k, then every v_k, then the clients' heads and rows: a generator
    # placed at the start of each part draws it a block at a time, in the very order one draw of it would
    gu, gb, gv, gz = (_skip(rng, n) for n in (0, k * c, k, k * d))

    def blocks() -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        for a, b in _client_blocks(sizes):
            u = gu.normal(0.0, cfg.synthetic_alpha, (b - a, c))
            v = gv.normal(gb.normal(0.0, cfg.synthetic_beta, (b - a, 1)), 1.0, (b - a, d))
            yield (a, b, *_synthetic_block(gz, u, v, sizes[a:b]))
    return ClientBlocks(sizes, (d,), c, blocks())


SKIP_CHUNK = 1 << 20  # normals drawn at once while skipping


def _skip(rng: np.random.Generator, n: int) -> np.random.Generator:
    """A copy of `rng` where it stands, after `rng` has drawn (and dropped) n standard normals: numpy's ziggurat
    keeps no state between calls, so the copy then draws what `rng` would have drawn from there."""
    for a in range(0, n, SKIP_CHUNK):
        rng.standard_normal(min(SKIP_CHUNK, n - a))
    copy = np.random.Generator(type(rng.bit_generator)())
    copy.bit_generator.state = rng.bit_generator.state
    return copy


SYNTHETIC_BLOCK_ROWS = 1 << 15  # samples drawn at once (about 5 MB of features)


def _client_blocks(sizes: np.ndarray) -> Iterator[tuple[int, int]]:
    """Consecutive client ranges [a, b) of about SYNTHETIC_BLOCK_ROWS samples (one client at least)."""
    a, k, span = 0, len(sizes), SYNTHETIC_BLOCK_ROWS  # the clients from a whose samples run to a block, at most
    while a < k:
        ends = np.cumsum(sizes[a:a + span])  # the samples from a's first one (no array over every client)
        b = a + int(np.searchsorted(ends, SYNTHETIC_BLOCK_ROWS, side="right"))
        if b == a + len(ends) < k:  # the window's clients hold no more than a block (some hold none): widen it
            span *= 2
            continue
        yield a, max(a + 1, b)
        a, span = max(a + 1, b), SYNTHETIC_BLOCK_ROWS


def _synthetic_block(rng: np.random.Generator, u: np.ndarray, v: np.ndarray, sizes: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) of consecutive clients with means u (classes) and v (features), from one draw of standard normals.

    Each client takes W_k (d x c), then b_k (c), then its x rows from the stream, in client order, as a loop
    over clients drawing `normal(u_k, 1)` and `standard_normal` would: the numbers do not depend on the blocks.
    """
    (m, d), c = v.shape, u.shape[1]
    head = d * c + c  # W_k and b_k: the stream alternates a client's head and its x rows
    z = rng.standard_normal(int(m * head + sizes.sum() * d))
    is_x = np.repeat(np.tile([False, True], m), np.column_stack([np.full(m, head), sizes * d]).reshape(-1))
    heads = z[~is_x].reshape(m, head)
    w = u[:, None, :] + heads[:, :d * c].reshape(m, d, c)
    b = u + heads[:, d * c:]
    owner = np.repeat(np.arange(m), sizes)
    first = np.cumsum(sizes) - sizes
    scale = np.arange(1, d + 1) ** -0.6  # sqrt of the covariance diagonal j^-1.2
    x = z[is_x].reshape(-1, d)
    x *= scale
    x += v[owner]  # v_k + z·scale, in place
    logits = np.empty((len(owner), c))
    for n in np.unique(sizes):  # clients of one size as a stack: each product is the loop's own x_k @ W_k
        same = np.flatnonzero(sizes == n)
        rows = first[same][:, None] + np.arange(n)
        logits[rows] = np.matmul(x[rows], w[same])
    return x.astype(np.float32), np.argmax(logits + b[owner], axis=1)


def class_indices(values: np.ndarray) -> tuple[np.ndarray, int, list[Any] | None]:
    """Class indices, their count and the label each index stands for: non-negative integer labels as they are
    (None: each label is its own index), anything else numbered by sorted unique value (those values)."""
    if np.issubdtype(values.dtype, np.integer) and (len(values) == 0 or values.min() >= 0):
        return values.astype(np.int64), int(values.max()) + 1 if len(values) else 0, None
    classes, index = np.unique(values, return_inverse=True)
    return index.astype(np.int64), len(classes), classes.tolist()


def _unreadable(path: str, e: Exception) -> DataError:
    """The error for a file that is not Parquet (or not readable as Parquet)."""
    return DataError(f"data.path: cannot read {path} as Parquet ({str(e).splitlines()[0]})")


def parquet_columns(cfg: DataConfig) -> tuple[str, list[str], bool]:
    """(the file, its feature columns, whether it has the client column) of source 'parquet', from the file's
    schema alone: the file, the label, feature and client columns are checked without reading a row."""
    path = cfg.path
    assert path is not None  # DataConfig requires data.path for source 'parquet'
    if not Path(path).is_file():
        raise DataError(f"data.path: {path!r} is not a file (source 'parquet' reads one Parquet file)")
    try:
        with pq.ParquetFile(path, memory_map=True) as file:
            schema, rows = file.schema_arrow, file.metadata.num_rows
    except (OSError, pa.ArrowException) as e:
        raise _unreadable(path, e) from e
    if rows == 0:
        raise DataError(f"data.path: {path} has no rows (source 'parquet' needs the samples of every client)")
    names = schema.names
    if cfg.label_column not in names:
        raise DataError(f"data.label_column: no column {cfg.label_column!r} in {path} (columns: {names})")
    if cfg.feature_columns is None:
        columns = [n for n in names
                   if n not in (cfg.label_column, cfg.client_column) and is_feature(schema.field(n).type)]
    else:
        columns = cfg.feature_columns
        missing = [n for n in columns if n not in names]
        if missing:
            raise DataError(f"data.feature_columns: no columns {missing} in {path} (columns: {names})")
    if not columns:
        raise DataError(f"data.feature_columns: {path} has no columns of numbers, arrays or images")
    has_clients = cfg.client_column in names
    if not has_clients and cfg.partition.kind == NATURAL:
        raise DataError(f"data.client_column: no column {cfg.client_column!r} in {path} "
                         f"for the natural partition (columns: {names})")
    return path, columns, has_clients


def parquet_clients(cfg: DataConfig) -> int:
    """The distinct values of the client column: the natural partition's clients, from that column alone."""
    path, _, has_clients = parquet_columns(cfg)
    if not has_clients:
        raise DataError(f"data.client_column: no column {cfg.client_column!r} in {path} to count the clients of")
    return len(pq.read_table(path, columns=[cfg.client_column]).column(0).unique())


@register_source("parquet", natural=True, check=parquet_columns, count=parquet_clients)
def parquet(cfg: DataConfig, seed: int) -> Source:
    """Any Parquet file: `label_column`, the feature columns, and `client_column` for a natural partition.

    Feature columns default to every column of numbers, arrays or images other than the label and
    client columns. An array or image column keeps its shape for CNNs (`data.feature_shape` sets
    or overrides it; see `raysim.data.columns.features`). Client ids are renumbered 0..K-1 in
    sorted order of their values.
    """
    path, columns, has_clients = parquet_columns(cfg)
    try:
        table = pq.read_table(path, memory_map=True)
    except (OSError, pa.ArrowException) as e:
        raise _unreadable(path, e) from e
    used = [cfg.label_column, *columns, *([cfg.client_column] if has_clients else [])]
    nulls = [n for n in used if table.column(n).null_count]
    if nulls:
        raise DataError(f"data.path: columns {nulls} of {path} contain nulls")
    x, image_shape = features(table, columns, cfg.feature_shape, path)
    y, num_classes, classes = class_indices(table.column(cfg.label_column).to_numpy())
    natural = None
    if has_clients:
        natural = np.unique(table.column(cfg.client_column).to_numpy(), return_inverse=True)[1].astype(np.int64)
    described = {"file": str(path), "label_column": cfg.label_column, "feature_columns": columns,
                 "client_column": cfg.client_column if has_clients else None, "classes": classes}
    return Source(x, y, (x.shape[1],), num_classes, natural_clients=natural, image_shape=image_shape,
                  description=described)
