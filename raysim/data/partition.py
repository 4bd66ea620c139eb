"""Partitioners: split a pooled training set among clients, one client id per sample.

A partitioner is `f(labels, num_clients, cfg, rng) -> client id per sample`; register new ones
with `@register_partitioner("name")`. `partition` checks what every partitioner must give:
each sample on exactly one client in [0, num_clients), every client at least `cfg.min_size`
samples. The `natural` kind is not a function of the labels: it passes the source's own
client assignment through the same checks.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from raysim.errors import DataError
from raysim.plugins import PARTITIONERS

if TYPE_CHECKING:
    from raysim.data.config import PartitionConfig

Partitioner = Callable[[np.ndarray, int, "PartitionConfig", np.random.Generator], np.ndarray]

NATURAL = "natural"
DIRICHLET_TRIES = 100


def register_partitioner(name: str, replace: bool = False) -> Callable[[Partitioner], Partitioner]:
    """Decorator: make `f(labels, num_clients, cfg, rng) -> ids` available as `partition.kind: name`; `replace`
    to take the name of another module's partitioner."""

    def wrap(fn: Partitioner) -> Partitioner:
        PARTITIONERS.add(name, fn, replace)
        return fn

    return wrap


def apportion(total: int, weights: np.ndarray, minimum: int = 0) -> np.ndarray:
    """Integer sizes summing to `total`: `minimum` each, the rest in proportion to `weights`.

    Largest-remainder rounding, so no size exceeds its exact share by one or more.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if total - minimum * len(weights) < 0:
        raise DataError(f"cannot give {len(weights)} parts at least {minimum} each out of {total}")
    return apportion_rows(np.array([total]), weights[None], minimum)[0]


def apportion_rows(totals: np.ndarray, weights: np.ndarray, minimum: int = 0) -> np.ndarray:
    """`apportion` of each row of the 2-D `weights` to its own total, all rows at once (no loop over rows)."""
    weights = np.asarray(weights, dtype=np.float64)
    rest = np.asarray(totals, dtype=np.int64) - minimum * weights.shape[1]
    weights = np.where(weights.sum(axis=1, keepdims=True) <= 0, 1.0, weights)
    exact = rest[:, None] * weights / weights.sum(axis=1, keepdims=True)
    del weights  # each (rows x columns) temporary goes as soon as it is used: 10^6 rows make 80 MB each
    sizes = np.floor(exact).astype(np.int64)
    short = rest - sizes.sum(axis=1)
    order = np.argsort(sizes - exact, axis=1, kind="stable")  # the largest remainders first
    del exact
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(order.shape[1])[None], axis=1)
    return sizes + (rank < short[:, None]) + minimum


def _deal(sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Client ids for a random assignment of sum(sizes) samples with the given client sizes."""
    ids = np.empty(int(sizes.sum()), dtype=np.int64)
    ids[rng.permutation(len(ids))] = np.repeat(np.arange(len(sizes)), sizes)
    return ids


def dense_index(values: np.ndarray) -> np.ndarray:
    """`np.unique(values, return_inverse=True)[1]`: each value's rank among the distinct values. For
    non-negative integers (labels, client ids) from a running count of the values present, with no sort
    of the 10^7 samples of a million clients."""
    values = np.asarray(values)
    if values.dtype.kind in "iu" and len(values) and values.min() >= 0 and values.max() <= 4 * len(values):
        return (np.cumsum(np.bincount(values) > 0) - 1)[values]
    return np.unique(values, return_inverse=True)[1].reshape(values.shape)


def compact_permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """`rng.permutation(n)`, the same numbers, as int32 while that fits: Generator.permutation shuffles an int64
    arange, and shuffling an int32 one draws the very same swaps (half the memory at 10^8)."""
    perm = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    rng.shuffle(perm)
    return perm


INVERSE_CHUNK = 1 << 20  # positions written at a time: no second array over every element


def inverse_permutation(perm: np.ndarray) -> np.ndarray:
    """Each element's position in the permutation `perm` (int32 while that fits: half the memory at 10^8), written
    a chunk of positions at a time."""
    pos = np.empty(len(perm), dtype=np.int32 if len(perm) < 2**31 else np.int64)
    for a in range(0, len(perm), INVERSE_CHUNK):
        pos[perm[a:a + INVERSE_CHUNK]] = np.arange(a, min(a + INVERSE_CHUNK, len(perm)), dtype=pos.dtype)
    return pos


def first_per_group(groups: np.ndarray, counts: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Indices of the `counts[g]` members of each group g that come first by `pos`, grouped, in `pos` order
    within a group (groups: ints in [0, len(counts)))."""
    sizes = np.bincount(groups, minlength=len(counts))
    order = np.lexsort((pos, groups))
    rank = np.arange(len(groups)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return order[rank < counts[groups[order]]]


def sample_per_group(groups: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of `counts[g]` distinct random members of each group g (groups: ints in [0, len(counts))):
    those first in one random permutation of all, grouped, in that permutation's order within a group."""
    return first_per_group(groups, counts, inverse_permutation(compact_permutation(rng, len(groups))))


def partition(
    labels: np.ndarray,
    num_clients: int,
    cfg: PartitionConfig,
    rng: np.random.Generator,
    natural: np.ndarray | None = None,
) -> np.ndarray:
    """Client id (int64) for every sample, by the partitioner `cfg.kind`.

    `natural` is the source's own client of each sample, required for `kind: natural`.
    Raises ValueError naming the field to change when the clients cannot all get `cfg.min_size`.
    """
    labels = np.asarray(labels)
    n = len(labels)
    if n < num_clients * cfg.min_size:
        raise DataError(
            f"data.num_clients: {num_clients} clients x partition.min_size={cfg.min_size} "
            f"needs {num_clients * cfg.min_size} training samples, only {n} exist")
    if cfg.kind == NATURAL:
        if natural is None:
            raise DataError("data.partition.kind: 'natural' needs a source that assigns samples to clients")
        ids = np.asarray(natural, dtype=np.int64)
        if not (n and ids.min() == 0 and ids.max() == num_clients - 1 and np.bincount(ids).all()):
            raise natural_clients_error(len(np.unique(ids)), num_clients)
    else:
        ids = np.asarray(PARTITIONERS.lookup(cfg.kind)(labels, num_clients, cfg, rng), dtype=np.int64)
    if ids.shape != (n,) or ids.min() < 0 or ids.max() >= num_clients:
        raise ValueError(f"partitioner {cfg.kind!r} must return one client id in [0, {num_clients}) per sample")
    check_min_size(np.bincount(ids, minlength=num_clients), cfg)
    return ids


def natural_clients_error(found: int, num_clients: int) -> DataError:
    """The error naming data.num_clients when the source's natural clients are not exactly 0..num_clients-1."""
    return DataError(f"data.num_clients: is {num_clients} but the source's natural partition has {found} clients")


def check_min_size(sizes: np.ndarray, cfg: PartitionConfig) -> None:
    """DataError naming partition.min_size when a client of `sizes` training samples has fewer than it."""
    if sizes.min() < cfg.min_size:
        raise DataError(
            f"data.partition.min_size: partition {cfg.kind!r} gives client {int(sizes.argmin())} only "
            f"{int(sizes.min())} training samples, fewer than min_size={cfg.min_size}")


@register_partitioner("iid")
def iid(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random split into equal sizes (differing by at most one)."""
    return _deal(apportion(len(labels), np.ones(num_clients)), rng)


@register_partitioner("quantity")
def quantity(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> np.ndarray:
    """Quantity skew: sizes proportional to LogNormal(0, quantity_sigma) draws, min_size each; samples iid."""
    weights = rng.lognormal(0.0, cfg.quantity_sigma, num_clients)
    return _deal(apportion(len(labels), weights, cfg.min_size), rng)


@register_partitioner("shards")
def shards(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> np.ndarray:
    """Label shards (McMahan et al.): sort by label, cut num_clients*shards_per_client shards, deal them."""
    count = num_clients * cfg.shards_per_client
    if len(labels) < count:
        raise DataError(f"data.partition.shards_per_client: {count} shards need at least {count} "
                         f"training samples, only {len(labels)} exist")
    order = rng.permutation(len(labels))
    order = order[np.argsort(labels[order], kind="stable")]
    owner = rng.permutation(count) // cfg.shards_per_client
    ids = np.empty(len(labels), dtype=np.int64)
    for shard, rows in enumerate(np.array_split(order, count)):
        ids[rows] = owner[shard]
    return ids


@register_partitioner("dirichlet")
def dirichlet(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> np.ndarray:
    """Label skew: each class is split over clients in proportions ~ Dirichlet(alpha).

    A draw in which some client has fewer than min_size samples is redrawn, up to
    DIRICHLET_TRIES times; after that the last draw is repaired by moving random samples from
    the clients with the largest surplus to the short ones.
    """
    classes = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    ids = np.empty(len(labels), dtype=np.int64)
    for _ in range(DIRICHLET_TRIES):
        for rows in classes:
            share = rng.dirichlet(np.full(num_clients, cfg.alpha))
            cuts = np.floor(np.cumsum(share)[:-1] * len(rows)).astype(np.int64)
            ids[rng.permutation(rows)] = np.repeat(np.arange(num_clients), np.diff(cuts, prepend=0, append=len(rows)))
        if np.bincount(ids, minlength=num_clients).min() >= cfg.min_size:
            return ids
    return _repair(ids, num_clients, cfg.min_size, rng)


@register_partitioner("dirichlet_classes")
def dirichlet_classes(labels: np.ndarray, num_clients: int, cfg: PartitionConfig, rng: np.random.Generator) -> np.ndarray:
    """The FedFisher code's Dirichlet split (the FedFisher paper Sec. 5.1): each client draws class proportions
    q_i ~ Dir(alpha 1_C); class k goes to client i in proportion q_ik / Σ_j q_jk. Redrawn (up to
    DIRICHLET_TRIES times) while some client has fewer than min_size samples. With `numpy_seed` the draws come
    from np.random.RandomState(numpy_seed) in the code's order: its split under np.random.seed(numpy_seed)."""
    draw: np.random.Generator | np.random.RandomState = rng if cfg.numpy_seed is None else np.random.RandomState(cfg.numpy_seed)
    classes = np.unique(labels)
    ids = np.empty(len(labels), dtype=np.int64)
    for _ in range(DIRICHLET_TRIES):
        q = draw.dirichlet(np.full(len(classes), cfg.alpha), size=num_clients)
        for k, c in enumerate(classes):
            rows = draw.permutation(np.flatnonzero(labels == c))
            share = q[:, k] / q[:, k].sum()
            cuts = np.floor(np.cumsum(share)[:-1] * len(rows)).astype(np.int64)
            ids[rows] = np.repeat(np.arange(num_clients), np.diff(cuts, prepend=0, append=len(rows)))
        if np.bincount(ids, minlength=num_clients).min() >= cfg.min_size:
            return ids
    raise DataError(f"data.partition.alpha: {DIRICHLET_TRIES} Dirichlet({cfg.alpha}) draws all left a client with "
                     f"fewer than min_size={cfg.min_size} samples; raise alpha or lower min_size")


def _repair(ids: np.ndarray, num_clients: int, min_size: int, rng: np.random.Generator) -> np.ndarray:
    """Move random samples from clients above min_size, in proportion to their surplus, to those below."""
    sizes = np.bincount(ids, minlength=num_clients)
    deficit = np.maximum(min_size - sizes, 0)
    take = apportion(int(deficit.sum()), np.maximum(sizes - min_size, 0))
    moved = rng.permutation(sample_per_group(ids, take, rng))
    ids = ids.copy()
    ids[moved] = np.repeat(np.arange(num_clients), deficit)
    return ids
