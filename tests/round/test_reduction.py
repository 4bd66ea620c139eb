"""The fixed reduction tree: the same bits from any split of the clients into shards."""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from raysim.core import compiled
from raysim.round.reduction import (_column_slices, _device_tree_sums, _tree_sums, cover, reduce_owned, reduce_stacked,
                                    root_size, tree_reduce, tree_schedule)


def add(a, b):
    return a + b  # float32 addition: not associative, so any change of order shows in the bits


@pytest.mark.parametrize("n", [1, 2, 5, 12, 100, 1000])
def test_cover_is_aligned_disjoint_and_exact(n):
    rng = np.random.default_rng(n)
    ids = sorted(rng.choice(n, size=max(1, n // 2), replace=False).tolist())
    blocks = cover(ids, n)
    got = [i for s, z in blocks for i in range(s, s + z)]
    assert sorted(i for i in got if i < n) == ids and len(got) == len(set(got))
    assert all(i >= n for i in got if i not in ids)  # beyond the ids, only the empty edge after the last client
    assert all(z & (z - 1) == 0 and s % z == 0 for s, z in blocks)  # aligned power-of-two blocks
    assert cover(range(n), n) == [(0, root_size(n))]  # a shard of every client: the root, whatever n
    assert (n - 1 in ids) == (max(s + z for s, z in blocks) == root_size(n))
    assert n <= root_size(n) < 2 * n or n == 1


@pytest.mark.parametrize("n, per_round", [(5, 3), (100, 10), (1000, 100), (37, 37)])
def test_any_split_into_shards_gives_the_same_bits(n, per_round):
    rng = np.random.default_rng(0)
    values = {c: (rng.standard_normal(64) * 10.0 ** rng.integers(-6, 6)).astype(np.float32) for c in range(n)}
    clients = rng.choice(n, size=per_round, replace=False).tolist()
    replies = {c: values[c] for c in clients}
    root = root_size(n)
    one = tree_reduce(reduce_owned(replies, cover(range(n), n), add), 0, root, add)
    for per_shard in (1, 2, 3, 7, n):
        parts = []
        for lo in range(0, n, per_shard):
            owned = range(lo, min(n, lo + per_shard))
            parts += reduce_owned({c: r for c, r in replies.items() if c in owned}, cover(owned, n), add)
        np.testing.assert_array_equal(tree_reduce(parts, 0, root, add), one)
    in_order = np.sum([replies[c] for c in sorted(clients)], axis=0, dtype=np.float32)
    np.testing.assert_allclose(one, in_order, rtol=1e-5, atol=1e-5 * np.abs(in_order).max())


def test_no_replies_reduce_to_nothing():
    assert reduce_owned({}, cover(range(4), 8), add) == []
    assert tree_reduce([], 0, 8, add) is None


def _perfect_tree(replies: dict, start: int, size: int):
    """The definition: the perfect binary tree over ids, a node the combination of its children with clients."""
    if size == 1:
        return replies.get(start)
    left, right = _perfect_tree(replies, start, size // 2), _perfect_tree(replies, start + size // 2, size // 2)
    return right if left is None else left if right is None else f"({left}+{right})"


@pytest.mark.parametrize("n, per_round, per_shard", [(1, 1, 1), (37, 37, 5), (1000, 100, 300), (5000, 40, 2500)])
def test_the_value_is_the_perfect_trees_whatever_the_parts_order(n, per_round, per_shard):
    """With a combination that shows its shape (a bracketed sum), shard parts given in any order give the tree of
    the definition, node for node."""
    rng = np.random.default_rng(n)
    replies = {int(c): str(c) for c in rng.choice(n, size=per_round, replace=False)}
    parts = []
    for lo in range(0, n, per_shard):
        owned = range(lo, min(n, lo + per_shard))
        parts += reduce_owned({c: r for c, r in replies.items() if c in owned}, cover(owned, n),
                              lambda a, b: f"({a}+{b})")
    rng.shuffle(parts)
    assert tree_reduce(parts, 0, root_size(n), lambda a, b: f"({a}+{b})") == _perfect_tree(replies, 0, root_size(n))


@dataclass
class _Reply:
    total: np.ndarray
    weight: float


@pytest.mark.parametrize("compiled_min", [pytest.param(0, id="compiled"), pytest.param(10**9, id="tensor-ops")])
@pytest.mark.parametrize("where", ["numpy", "cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_the_stacked_reduction_gives_the_pairwise_trees_bits(monkeypatch, where, compiled_min):
    """reduce_stacked over replies stacked in any order equals reduce_owned with the fieldwise-sum combine, bit
    for bit, over 200 random federations, shards and surviving clients (float32 totals across 6 decades), whether
    the totals are arrays or tensors (summed where they live, a GPU's included), whichever rows are dropped, and
    whether the host sums them compiled (`tree_kernel`) or by tensor operations a level at a time."""
    monkeypatch.setattr(compiled, "COMPILED_MIN", compiled_min)
    rng = np.random.default_rng(0)
    combine = lambda a, b: _Reply(np.sum([a.total, b.total], axis=0), a.weight + b.weight)  # noqa: E731
    for trial in range(200):
        n = int(rng.integers(1, 300))
        owned = np.sort(rng.choice(n, int(rng.integers(1, n + 1)), replace=False))
        blocks = cover(owned.tolist(), n)
        kept = owned[rng.random(owned.size) < 0.7]
        rng.shuffle(kept)
        total = (rng.standard_normal((kept.size, 7)) * 10 ** rng.uniform(-3, 3, (kept.size, 1))).astype(np.float32)
        weight = rng.integers(1, 50, kept.size) * 0.1
        pairwise = reduce_owned({int(c): _Reply(total[i], float(weight[i])) for i, c in enumerate(kept)}, blocks, combine)
        rows = total if where == "numpy" else torch.from_numpy(total).to(where)
        stacked = reduce_stacked(kept, _Reply(rows, weight), blocks)
        assert rows.tobytes() == total.tobytes() if where == "numpy" else torch.equal(rows.cpu(), torch.from_numpy(total))
        assert [(s, z) for s, z, _ in stacked] == [(s, z) for s, z, _ in pairwise], trial
        for (_, _, a), (_, _, b) in zip(pairwise, stacked):
            assert a.total.tobytes() == b.total.tobytes() and a.weight == b.weight and type(b.weight) is float, trial
            assert isinstance(b.total, np.ndarray), trial  # a shard's parts leave it as host arrays


@pytest.mark.parametrize("where", ["numpy", "cpu"])
def test_half_precision_uploads_of_many_clients_are_summed_as_the_pairwise_tree_sums_them(where):
    """Numba has no half type on the CPU: a float16 field (an algorithm's compressed uploads) of COMPILED_MIN
    clients or more is summed by tensor operations, not handed to the compiled tree, whose call failed."""
    rng = np.random.default_rng(1)
    n = compiled.COMPILED_MIN + 500
    kept = np.sort(rng.choice(n, compiled.COMPILED_MIN + 100, replace=False))
    blocks = cover(range(n), n)
    total = rng.standard_normal((kept.size, 3)).astype(np.float16)
    weight = rng.integers(1, 50, kept.size) * 0.1
    combine = lambda a, b: _Reply(np.sum([a.total, b.total], axis=0), a.weight + b.weight)  # noqa: E731
    pairwise = reduce_owned({int(c): _Reply(total[i], float(weight[i])) for i, c in enumerate(kept)}, blocks, combine)
    rows = total if where == "numpy" else torch.from_numpy(total)
    stacked = reduce_stacked(kept, _Reply(rows, weight), blocks)
    assert [(s, z) for s, z, _ in stacked] == [(s, z) for s, z, _ in pairwise]
    for (_, _, a), (_, _, b) in zip(pairwise, stacked):
        assert b.total.dtype == np.float16 and a.total.tobytes() == b.total.tobytes() and a.weight == b.weight


def test_the_gpus_sums_into_fresh_rows_give_the_in_place_bits():
    """A GPU's tree (each level's sums written to fresh rows, no scatter) gives the in-place index_add_ tree's bits:
    checked here on CPU tensors over 200 random federations, shards and unsorted surviving clients, so it holds
    without a GPU (test_the_stacked_reduction_gives_the_pairwise_trees_bits runs it on one)."""
    rng = np.random.default_rng(5)
    for trial in range(200):
        n = int(rng.integers(1, 400))
        owned = np.sort(rng.choice(n, int(rng.integers(1, n + 1)), replace=False))
        kept = owned[rng.random(owned.size) < 0.7]
        if trial % 2:
            rng.shuffle(kept)
        total = torch.from_numpy((rng.standard_normal((kept.size, 5)) * 10 ** rng.uniform(-3, 3, (kept.size, 1)))
                                 .astype(np.float32))
        order, pairs, nodes, _, _ = tree_schedule(kept, cover(owned.tolist(), n))
        fresh = _device_tree_sums(total, order, pairs, nodes)
        assert torch.equal(fresh, _tree_sums(total, order, pairs, nodes, None, 1)), trial
        assert fresh.shape[0] == len(nodes) and (kept.size < 2 or pairs or len(nodes) == kept.size), trial


def test_the_compiled_schedule_is_the_numpy_levels(monkeypatch):
    """From COMPILED_MIN ids the tree's schedule (a GPU shard's) is compiled: the very order, pairs a level, node rows
    and blocks of the NumPy levels, over 200 random federations, shards (blocks of every size, some of one client)
    and unsorted surviving clients."""
    rng = np.random.default_rng(11)
    for trial in range(200):
        n = int(rng.integers(1, 3000))
        owned = np.sort(rng.choice(n, int(rng.integers(1, n + 1)), replace=False))
        kept = owned[rng.random(owned.size) < rng.uniform(0.05, 1)]
        if trial % 2:
            rng.shuffle(kept)
        blocks = cover(owned.tolist(), n)
        monkeypatch.setattr(compiled, "COMPILED_MIN", 10**9)
        want = tree_schedule(kept, blocks)
        monkeypatch.setattr(compiled, "COMPILED_MIN", 0)
        got = tree_schedule(kept, blocks)
        assert (want[0] is None) == (got[0] is None) and (want[0] is None or np.array_equal(want[0], got[0])), trial
        assert len(want[1]) == len(got[1]), trial
        for (a, b), (c, d) in zip(want[1], got[1]):
            assert np.array_equal(a, c) and np.array_equal(b, d), trial
        for w, g in zip(want[2:], got[2:]):
            assert np.array_equal(w, g), trial


@pytest.mark.parametrize("compiled_min", [pytest.param(0, id="compiled"), pytest.param(10**9, id="tensor-ops")])
def test_a_wide_field_summed_a_column_slice_per_thread_gives_the_same_bits(monkeypatch, compiled_min):
    """A field of 5,000 columns summed on 4 threads (a slice of columns each) gives the one thread's bits."""
    monkeypatch.setattr(compiled, "COMPILED_MIN", compiled_min)
    rng = np.random.default_rng(3)
    n = 500
    owned = np.arange(n)
    kept = np.sort(rng.choice(n, 300, replace=False))
    total = (rng.standard_normal((kept.size, 5000)) * 10 ** rng.uniform(-3, 3, (kept.size, 1))).astype(np.float32)
    reply = _Reply(torch.from_numpy(total), rng.integers(1, 50, kept.size) * 0.1)
    blocks = cover(owned.tolist(), n + 1)  # a shard short of the federation's last client: several blocks
    one = reduce_stacked(kept, reply, blocks)
    with ThreadPoolExecutor(4) as pool:
        four = reduce_stacked(kept, reply, blocks, pool, 4)
    assert [(s, z) for s, z, _ in one] == [(s, z) for s, z, _ in four] and len(one) > 1
    for (_, _, a), (_, _, b) in zip(one, four):
        assert a.total.tobytes() == b.total.tobytes() and a.weight == b.weight
    assert len(_column_slices(reply.total, 4)) == 4 and len(_column_slices(reply.total[:, :1500], 4)) == 1
