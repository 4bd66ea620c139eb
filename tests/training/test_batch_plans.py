"""Minibatch plans drawn for a whole batch of clients at once: each pass a permutation of the client's samples,
uniformly random (Monte Carlo), and a client's plan the same whoever is drawn with it."""
import numpy as np
import pytest
import torch
from scipy import stats

from raysim.core import compiled
from raysim.core.keys import Keys
from raysim.core.rng import stream
from raysim.training import batch_plan, batch_plans, local_sgd


def test_every_pass_takes_each_sample_once():
    sizes = np.array([23, 3, 10, 1, 700, 64])
    plans = batch_plans(sizes, 5, None, 2, Keys(0, 1, np.arange(6), "step"))
    for i, n in enumerate(sizes):
        b = min(5, n)
        per_epoch = -(-n // b)
        for epoch in range(2):
            rows = slice(epoch * per_epoch, (epoch + 1) * per_epoch)
            used = plans.idx[i, rows][plans.w[i, rows] > 0]
            assert sorted(used.tolist()) == list(range(n))
        assert plans.w[i].sum() == 2 * n and not plans.w[i, 2 * per_epoch:].any()  # then padding only


def test_a_clients_plan_is_its_own_whoever_shares_the_call():
    """Sizes across buckets (1 to 1,500), steps spanning passes: each client's rows equal its plan drawn alone
    (`batch_plan` from its stream, the per-client path) and do not move when others join or the width grows."""
    rng = np.random.default_rng(3)
    ids = rng.choice(10**6, 40, replace=False)
    sizes = rng.integers(1, 1500, 40)
    together = batch_plans(sizes, 6, 9, None, Keys(2, 5, ids, "step"), width=8)
    half = batch_plans(sizes[::2], 6, 9, None, Keys(2, 5, ids[::2], "step"))
    for i, (c, n) in enumerate(zip(ids, sizes)):
        alone = batch_plan(int(n), 6, 9, None, stream(2, 5, int(c), "step"))
        b = alone.idx.shape[1]
        np.testing.assert_array_equal(together.idx[i, :, :b], alone.idx)
        np.testing.assert_array_equal(together.w[i, :, :b], alone.w)
        assert not together.w[i, :, b:].any()
        if i % 2 == 0:
            np.testing.assert_array_equal(half.idx[i // 2, :, :b], alone.idx)


def test_a_pass_is_a_uniform_permutation():
    """Over 20,000 clients of 5 samples: the first sample of a pass is uniform over the 5 (chi-square p > 1e-4),
    and sample 0 comes before sample 1 half the time (within 5 standard errors)."""
    plans = batch_plans(np.full(20_000, 5), 5, 1, None, Keys(0, 1, np.arange(20_000), "step"))
    first = plans.idx[:, 0, 0]
    assert stats.chisquare(np.bincount(first, minlength=5)).pvalue > 1e-4
    order = plans.idx[:, 0, :]
    before = (np.argmax(order == 0, axis=1) < np.argmax(order == 1, axis=1)).mean()
    assert abs(before - 0.5) < 5 * np.sqrt(0.25 / 20_000)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device"))])
def test_plans_drawn_on_a_device_are_the_hosts(monkeypatch, device):
    """The device's path (torch's size classes, here on CPU tensors or a GPU) draws the host's NumPy plans (its
    exact-size groups and size classes), entry for entry, for steps or epochs."""
    rng = np.random.default_rng(4)
    for batch_size, steps, epochs in [(5, 5, None), (None, None, 2), (3, None, 3), (32, 7, None)]:
        sizes = rng.permutation(np.concatenate([rng.integers(1, 90, 200), np.full(local_sgd.HOST_EXACT_MIN, 7)]))
        keys = Keys(9, 3, np.sort(rng.choice(10**7, sizes.size, replace=False)), "step")
        host = batch_plans(sizes, batch_size, steps, epochs, keys, width=40)
        n, b, per_epoch, s = local_sgd._passes(sizes, batch_size, steps, epochs)
        there = local_sgd._device_plans(n, b, per_epoch, s, -(-s // per_epoch), keys, max(int(b.max()), 40),
                                          torch.device(device))
        assert there.idx.device.type == device and np.array_equal(there.idx.cpu().numpy(), host.idx)
        assert np.array_equal(there.w.cpu().numpy(), host.w) and host.idx.dtype == np.int64
        tensors = batch_plans(sizes, batch_size, steps, epochs, keys, width=40, device=device)
        assert tensors.idx.device.type == device and np.array_equal(tensors.idx.cpu().numpy(), host.idx)
        monkeypatch.setattr(compiled, "COMPILED_MIN", sizes.size)  # an accelerator's: the host's cores, then copied
        copied = batch_plans(sizes, batch_size, steps, epochs, keys, width=40, device=device)
        monkeypatch.setattr(compiled, "COMPILED_MIN", sizes.size + 1)
        assert copied.idx.device.type == device and copied.idx.dtype == torch.int64 and copied.w.dtype == torch.float64
        assert np.array_equal(copied.idx.cpu().numpy(), host.idx) and np.array_equal(copied.w.cpu().numpy(), host.w)


def test_the_host_draws_a_common_size_alone_and_the_rest_by_size_class():
    sizes = np.array([7] * local_sgd.HOST_EXACT_MIN + [5] * (local_sgd.HOST_EXACT_MIN - 1) + [6, 8, 3, 4, 100])
    sizes = np.random.default_rng(6).permutation(sizes)
    groups = local_sgd._host_groups(sizes)
    assert sorted(np.concatenate(groups).tolist()) == list(range(sizes.size))  # every client once
    assert sorted(sorted(set(sizes[g].tolist())) for g in groups) == [[3, 4], [5, 6, 8], [7], [100]]


@pytest.mark.parametrize("budget, groups", [(0, 11), (1 << 24, 1), (1 << 12, 3)])
def test_size_classes_drawn_together_give_the_same_plans(monkeypatch, budget, groups):
    """A device's draws, a size class each or classes merged into padded draws (all into one, or neighbours while a
    merge adds little padding), give every client its host plan."""
    rng = np.random.default_rng(5)
    sizes = np.concatenate([rng.integers(1, 9, 50), rng.integers(9, 300, 50), [1000]])
    keys = Keys(1, 2, np.arange(sizes.size) * 7, "step")
    host = batch_plans(sizes, 8, None, 2, keys)
    assert len(local_sgd._size_groups(sizes, np.full(sizes.size, 2), budget)) == groups
    monkeypatch.setattr(local_sgd, "DEVICE_PAD_ELEMENTS", budget)
    n, b, per_epoch, s = local_sgd._passes(sizes, 8, None, 2)
    there = local_sgd._device_plans(n, b, per_epoch, s, -(-s // per_epoch), keys, int(b.max()), torch.device("cpu"))
    assert np.array_equal(there.idx.numpy(), host.idx) and np.array_equal(there.w.numpy(), host.w)


@pytest.mark.parametrize("batch_size, local_steps, local_epochs", [
    (5, 9, None), (8, None, 3), (None, 4, None), (None, None, 2), (1, 17, None), (64, None, 1)])
def test_plan_sizes_count_the_samples_and_steps_of_the_drawn_plans(batch_size, local_steps, local_epochs):
    """The buffered and async schedules time a client by these counts before its plan is drawn."""
    sizes = np.random.default_rng(4).integers(1, 300, 60)
    plans = batch_plans(sizes, batch_size, local_steps, local_epochs, Keys(1, 2, np.arange(60), "step"))
    samples, steps = local_sgd.plan_sizes(sizes, batch_size, local_steps, local_epochs)
    np.testing.assert_array_equal(samples, plans.w.sum((1, 2)))
    np.testing.assert_array_equal(steps, plans.w.any(2).sum(1))


@pytest.mark.parametrize("length", [1, 5, 6, 10, 1024, 1025])
def test_the_hosts_argsort_is_the_stable_one_with_ties_and_the_largest_keys(length):
    """`stable_argsort` (positions as the keys' low bits where rows are long enough) gives NumPy's stable order,
    ties kept in position order, at the lengths on both sides of where it switches and up to keys of 2^53 - 1."""
    rng = np.random.default_rng(length)
    top = (1 << 53) - 1
    for keys in [rng.integers(0, 3, (50, length)), top - rng.integers(0, 2, (50, length)),
                 rng.integers(0, 1 << 53, (4, 3, length))]:
        np.testing.assert_array_equal(local_sgd.stable_argsort(keys), np.argsort(keys, axis=-1, kind="stable"))
