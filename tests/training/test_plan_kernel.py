"""The compiled host plans: Philox word for word against Random123's known answers, the stable order with ties,
and every client's plan the NumPy path's, entry for entry, for steps or epochs, short and long passes."""
import numpy as np
import pytest

from raysim.core import compiled
from raysim.core.keys import Keys
from raysim.training import batch_plans, local_sgd, plan_kernel

KAT = [  # Random123's kat_vectors: philox4x32 10, counter[4] key[2] -> output[4]
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_the_compiled_philox_gives_the_reference_words(counter, key, expected):
    words = plan_kernel.philox(*(np.uint32(c) for c in counter), *(np.uint32(k) for k in key))
    assert [int(w) for w in words] == expected


@pytest.mark.parametrize("length", [1, 2, 5, plan_kernel.INSERTION_MAX, plan_kernel.INSERTION_MAX + 1, 100, 128, 300,
                                    1000])
def test_the_compiled_order_is_the_stable_argsort_with_ties(length):
    """One insertion run, several runs merged an odd or even number of times, with many ties and with keys up to
    2^53 - 1, at an offset into the arrays (a pass of a client's draws)."""
    rng = np.random.default_rng(length)
    top = (1 << 53) - 1
    for keys in [rng.integers(0, 3, length), top - rng.integers(0, 2, length), rng.integers(0, 1 << 53, length)]:
        padded = np.concatenate([rng.integers(0, 9, 4), keys, rng.integers(0, 9, 3)])
        out, spare = np.full(padded.size, -1, dtype=np.int64), np.full(padded.size, -1, dtype=np.int64)
        plan_kernel.stable_order(padded, 4, length, out, spare)
        np.testing.assert_array_equal(out[4:4 + length], np.argsort(keys, kind="stable"))
        assert (out[:4] == -1).all() and (out[4 + length:] == -1).all()
        assert (spare[:4] == -1).all() and (spare[4 + length:] == -1).all()


@pytest.mark.parametrize("batch_size, local_steps, local_epochs, width", [
    (5, 5, None, 5), (None, None, 2, None), (3, None, 3, 8), (32, 7, None, 40), (1, 17, None, 1), (8, None, 1, 8)])
def test_the_compiled_plans_are_the_numpy_plans(monkeypatch, batch_size, local_steps, local_epochs, width):
    """A call of COMPILED_MIN clients and more draws compiled; the same call below it draws in NumPy (exact-size
    groups and size classes): the same plans, entry for entry, for clients of 1 to 400 samples (passes of one
    insertion run and of runs merged), ids up to 2^33 and a seed beyond 32 bits."""
    rng = np.random.default_rng(7)
    sizes = rng.permutation(np.concatenate([rng.integers(1, 90, 300), np.full(local_sgd.HOST_EXACT_MIN, 7),
                                            [1, 33, 400]]))
    keys = Keys(2**40 + 11, 4, np.sort(rng.choice(2**33, sizes.size, replace=False)), "step")
    monkeypatch.setattr(compiled, "COMPILED_MIN", sizes.size)
    kernel = batch_plans(sizes, batch_size, local_steps, local_epochs, keys, width)
    monkeypatch.setattr(compiled, "COMPILED_MIN", sizes.size + 1)
    numpy = batch_plans(sizes, batch_size, local_steps, local_epochs, keys, width)
    assert kernel.idx.dtype == numpy.idx.dtype and kernel.w.dtype == numpy.w.dtype
    np.testing.assert_array_equal(kernel.idx, numpy.idx)
    np.testing.assert_array_equal(kernel.w, numpy.w)


@pytest.mark.parametrize("part_min", [1, 37, 10**6])
def test_an_accelerators_host_plans_split_over_threads_are_the_plans(monkeypatch, part_min):
    """An accelerator's shard draws its plans on its host cores (slices of the clients, one a thread) in narrow
    types: every client's plan is `host_plans`', entry for entry, however the clients are sliced."""
    monkeypatch.setattr(plan_kernel, "PART_MIN", part_min)
    monkeypatch.setattr(compiled, "_SHARE", None)  # every numba thread (a shard built before may have capped them)
    rng = np.random.default_rng(12)
    sizes = rng.integers(1, 90, 700)
    keys = Keys(2**40 + 3, 2, np.sort(rng.choice(2**33, sizes.size, replace=False)), "step")
    for batch_size, local_steps, local_epochs in [(5, 5, None), (None, None, 2), (3, None, 3)]:
        n, b, per_epoch, steps = local_sgd._passes(sizes, batch_size, local_steps, local_epochs)
        S, width = int(steps.max()), int(b.max()) + 3
        idx, w = plan_kernel.device_host_plans(n, b, per_epoch, steps, keys, S, width)
        want_idx, want_w = plan_kernel.host_plans(n, b, per_epoch, steps, keys, S, width)
        assert idx.dtype == np.int32 and w.dtype == np.uint8
        np.testing.assert_array_equal(idx, want_idx)
        np.testing.assert_array_equal(w, want_w)


@pytest.mark.parametrize("share,parts", [(None, 8), (3, 3), (1, 1)])
def test_an_accelerators_host_plans_take_no_more_threads_than_the_processs_cpu_share(monkeypatch, share, parts):
    """The plans' parallel kernel takes at most the process's CPU share of threads (`compiled.use_host_threads`, set
    by a client shard): a node runs a client actor per CPU by default. The same plans either way."""
    taken = []
    fill = plan_kernel._fill_parts
    monkeypatch.setattr(plan_kernel, "_fill_parts", lambda *a: taken.append(a[-1]) or fill(*a))
    monkeypatch.setattr(plan_kernel, "get_num_threads", lambda: 8)  # numba's threads on an 8-core node
    monkeypatch.setattr(plan_kernel, "PART_MIN", 1)
    monkeypatch.setattr(compiled, "_SHARE", None)  # restored after the test
    compiled.use_host_threads(share)
    sizes = np.random.default_rng(3).integers(1, 40, 50)
    keys = Keys(5, 1, np.arange(50), "step")
    n, b, per_epoch, steps = local_sgd._passes(sizes, 5, 5, None)
    idx, w = plan_kernel.device_host_plans(n, b, per_epoch, steps, keys, 5, 5)
    assert taken == [parts]
    want_idx, want_w = plan_kernel.host_plans(n, b, per_epoch, steps, keys, 5, 5)
    np.testing.assert_array_equal(idx, want_idx)
    np.testing.assert_array_equal(w, want_w)
