"""Partitioners: determinism, coverage, min_size, and the heterogeneity each one is for."""
from __future__ import annotations

import numpy as np
import pytest

from raysim.core.rng import SERVER, SETUP, stream
from raysim.data import PartitionConfig, partition, register_partitioner
from raysim.data.partition import apportion, apportion_rows, dense_index, dirichlet_classes, inverse_permutation
from raysim.plugins import PARTITIONERS

KINDS = ["iid", "dirichlet", "shards", "quantity"]


def rng(seed: int = 0) -> np.random.Generator:
    return stream(seed, SETUP, SERVER, "partition")


@pytest.fixture
def labels() -> np.ndarray:
    """1000 samples, 10 balanced classes, shuffled."""
    return stream(99, SETUP, SERVER, "labels").permutation(np.repeat(np.arange(10), 100))


def label_entropy(labels: np.ndarray, ids: np.ndarray, num_clients: int) -> float:
    """Mean over clients of the entropy (nats) of the client's label distribution."""
    out = []
    for c in range(num_clients):
        p = np.bincount(labels[ids == c], minlength=10) / np.sum(ids == c)
        out.append(-np.sum(p[p > 0] * np.log(p[p > 0])))
    return float(np.mean(out))


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_given_seed_and_different_across_seeds(labels, kind):
    cfg = PartitionConfig(kind=kind)
    a = partition(labels, 10, cfg, rng(0))
    assert np.array_equal(a, partition(labels, 10, cfg, rng(0)))
    assert not np.array_equal(a, partition(labels, 10, cfg, rng(1)))


@pytest.mark.parametrize("kind", KINDS)
def test_every_sample_on_exactly_one_client_and_min_size(labels, kind):
    cfg = PartitionConfig(kind=kind, alpha=0.1, min_size=20)
    ids = partition(labels, 25, cfg, rng())
    assert ids.shape == labels.shape and ids.dtype == np.int64
    assert ids.min() >= 0 and ids.max() < 25
    sizes = np.bincount(ids, minlength=25)
    assert sizes.sum() == len(labels) and sizes.min() >= 20


def test_iid_equal_sizes(labels):
    sizes = np.bincount(partition(labels, 7, PartitionConfig(kind="iid"), rng()), minlength=7)
    assert sizes.max() - sizes.min() <= 1


def test_dirichlet_small_alpha_skews_labels_more(labels):
    skewed = partition(labels, 10, PartitionConfig(kind="dirichlet", alpha=0.05), rng())
    mild = partition(labels, 10, PartitionConfig(kind="dirichlet", alpha=100.0), rng())
    assert label_entropy(labels, skewed, 10) < 1.0 < 2.0 < label_entropy(labels, mild, 10)


def test_dirichlet_repairs_min_size_when_redraws_fail(labels):
    # alpha = 0.01 over 200 clients leaves most clients empty in every draw: the repair must act
    ids = partition(labels, 200, PartitionConfig(kind="dirichlet", alpha=0.01, min_size=3), rng())
    sizes = np.bincount(ids, minlength=200)
    assert sizes.min() >= 3 and sizes.sum() == len(labels)


def test_too_few_samples_for_min_size_is_a_clear_error(labels):
    with pytest.raises(ValueError, match=r"data\.num_clients.*min_size"):
        partition(labels, 101, PartitionConfig(kind="dirichlet", min_size=10), rng())


@pytest.mark.parametrize("clients, per_client", [(10, 2), (25, 2), (5, 4)])
def test_shards_give_at_most_shards_per_client_labels(labels, clients, per_client):
    ids = partition(labels, clients, PartitionConfig(kind="shards", shards_per_client=per_client), rng())
    for c in range(clients):
        assert len(np.unique(labels[ids == c])) <= per_client


def test_quantity_gives_unequal_sizes(labels):
    sizes = np.bincount(partition(labels, 10, PartitionConfig(kind="quantity", quantity_sigma=1.0), rng()))
    assert sizes.sum() == len(labels) and sizes.max() > 2 * sizes.min()


def test_natural_passes_the_source_clients_through_and_checks_their_count(labels):
    natural = np.arange(len(labels)) % 4
    assert np.array_equal(partition(labels, 4, PartitionConfig(kind="natural"), rng(), natural=natural), natural)
    with pytest.raises(ValueError, match=r"data\.num_clients"):
        partition(labels, 5, PartitionConfig(kind="natural"), rng(), natural=natural)


def test_registered_partitioner_is_usable_from_config(labels):
    @register_partitioner("round_robin")
    def round_robin(labels, num_clients, cfg, rng):
        return np.arange(len(labels)) % num_clients

    try:
        ids = partition(labels, 3, PartitionConfig(kind="round_robin"), rng())
        assert np.array_equal(np.bincount(ids), [334, 333, 333])
    finally:
        PARTITIONERS.pop("round_robin")


def test_apportion_sums_and_respects_minimum():
    sizes = apportion(100, np.array([1.0, 0.0, 3.0, 1e-9]), minimum=5)
    assert sizes.sum() == 100 and sizes.min() >= 5
    with pytest.raises(ValueError):
        apportion(10, np.ones(3), minimum=4)


def test_apportion_rows_is_apportion_of_each_row():
    """The vectorized form (the holdout of 10^6 natural clients) gives bitwise each row's own apportion, zero rows too."""
    rng = np.random.default_rng(0)
    weights = np.floor(rng.random((300, 10)) * 8) * (rng.random((300, 10)) < 0.6)
    weights[::25] = 0.0
    totals = rng.integers(0, 60, 300)
    expected = np.stack([apportion(int(t), w) for t, w in zip(totals, weights)])
    assert np.array_equal(apportion_rows(totals, weights), expected) and (weights.sum(1) == 0).any()


def test_dirichlet_classes_orientation_and_heterogeneity():
    """Large alpha: every client near 1/M of every class; small alpha: each client is dominated by few classes."""
    labels = np.repeat(np.arange(10), 500)
    rng = np.random.default_rng(0)
    even = dirichlet_classes(labels, 5, PartitionConfig(kind="dirichlet_classes", alpha=1e4), rng)
    counts = np.array([np.bincount(labels[even == i], minlength=10) for i in range(5)])
    assert np.abs(counts / 500 - 0.2).max() < 0.02
    skew = dirichlet_classes(labels, 5, PartitionConfig(kind="dirichlet_classes", alpha=0.05), rng)
    top = [np.sort(np.bincount(labels[skew == i], minlength=10))[::-1][:2].sum() / (skew == i).sum() for i in range(5)]
    assert np.mean(top) > 0.8


def fedfisher_code_split(y: np.ndarray, n: int, alpha: float, num_c: int) -> np.ndarray:
    """The FedFisher code's __getDirichletData__ (the FedFisher paper Sec. 5.1), transcribed, on numpy's global stream."""
    p_client = np.zeros((n, num_c))
    for i in range(n):
        p_client[i] = np.random.dirichlet(np.repeat(alpha, num_c))
    idx_batch = [[] for _ in range(n)]
    for k in range(num_c):
        idx_k = np.where(y == k)[0]
        np.random.shuffle(idx_k)
        proportions = p_client[:, k] / p_client[:, k].sum()
        proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
        idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))]
    ids = np.empty(len(y), dtype=np.int64)
    for j in range(n):
        ids[idx_batch[j]] = j
    return ids


@pytest.mark.parametrize("seed, alpha", [(3, 0.2), (0, 0.1)])
def test_dirichlet_classes_numpy_seed_is_the_fedfisher_codes_split(labels, seed, alpha):
    """numpy_seed s gives bitwise the code's split under np.random.seed(s), whatever raysim stream is passed."""
    np.random.seed(seed)
    expected = fedfisher_code_split(labels, 5, alpha, 10)
    cfg = PartitionConfig(kind="dirichlet_classes", alpha=alpha, numpy_seed=seed)
    assert np.array_equal(dirichlet_classes(labels, 5, cfg, rng(7)), expected)
    assert np.array_equal(partition(labels, 5, cfg, rng(8)), expected)


def test_numpy_seed_is_only_for_dirichlet_classes():
    with pytest.raises(ValueError, match="numpy_seed: only kind 'dirichlet_classes'"):
        PartitionConfig(kind="dirichlet", numpy_seed=3)


@pytest.mark.parametrize("values", [
    [3, 3, 0, 7, 7, 7, 2], [0, 1, 2, 3], [5], [-2, 4, -2, 9], [10**12, 1, 10**12], [2.5, -1.0, 2.5],
    list(np.random.default_rng(0).integers(0, 50, 1000)), np.uint8([9, 1, 9])], ids=str)
def test_dense_index_is_uniques_inverse(values):
    """Each value's rank among the distinct values, as np.unique's inverse: gaps, negatives, huge ids, floats."""
    values = np.asarray(values)
    got = dense_index(values)
    assert got.dtype.kind == "i" and np.array_equal(got, np.unique(values, return_inverse=True)[1])


@pytest.mark.parametrize("n", [0, 1, 7, 64, 1000])
def test_a_permutations_inverse_is_its_argsort_across_chunks(n, monkeypatch):
    """Each element's position in the permutation, written a chunk at a time (chunks of 7 here), is argsort(perm)."""
    import importlib

    monkeypatch.setattr(importlib.import_module("raysim.data.partition"), "INVERSE_CHUNK", 7)
    perm = np.random.default_rng(n).permutation(n).astype(np.int32)
    pos = inverse_permutation(perm)
    assert pos.dtype == np.int32 and np.array_equal(pos, np.argsort(perm))

