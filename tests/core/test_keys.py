"""Counter-based keyed draws: Philox4x32-10 word for word against the Random123 known-answer vectors, a client's
draws independent of the clients drawn with it, and uniform within a Monte Carlo tolerance."""
import zlib

import numpy as np
import pytest
import torch
from scipy import stats

from raysim.core.keys import Keys, philox4x32, uniforms
from raysim.core.rng import stream

KAT = [  # Random123's kat_vectors: philox4x32 10, counter[4] key[2] -> output[4]
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))]


@pytest.mark.parametrize("counter, key, expected", KAT)
def test_philox_gives_the_reference_words(counter, key, expected):
    assert [int(w[0]) for w in philox4x32(tuple(np.array([c]) for c in counter), tuple(key))] == expected
    batch = philox4x32(tuple(np.array([c, c], dtype=np.int64) for c in counter), tuple(key))
    assert [w.tolist() for w in batch] == [[e, e] for e in expected]  # vectorized over counters, word for word
    on_torch = philox4x32(tuple(torch.tensor([c, c]) for c in counter), tuple(key))
    assert [w.tolist() for w in on_torch] == [[e, e] for e in expected]  # torch's int64 tensors, the same words


@pytest.mark.parametrize("device", DEVICES)
def test_a_devices_draws_are_the_hosts_bit_for_bit(device):
    ids = np.array([0, 5, 2**31, 2**32 - 2, 10**9 + 7, 123456])
    for seed, round, n in [(0, 1, 9), (2**40 + 5, -1, 4), (7, 10**6, 1)]:
        host = uniforms(seed, round, ids, "step", n)
        there = uniforms(seed, round, ids, "step", n, device)
        assert there.dtype == torch.float64 and there.device.type == device
        assert there.cpu().numpy().tobytes() == host.tobytes()


def test_a_clients_draws_do_not_depend_on_who_is_drawn_with_it():
    ids = np.array([7, 3, 10**6, 0, 42])
    every = uniforms(5, 3, ids, "step", 9)
    for i, c in enumerate(ids):
        np.testing.assert_array_equal(uniforms(5, 3, np.array([c]), "step", 9)[0], every[i])
        np.testing.assert_array_equal(uniforms(5, 3, np.array([c]), "step", 4)[0], every[i, :4])  # a prefix
    others = [uniforms(6, 3, ids, "step", 9), uniforms(5, 4, ids, "step", 9), uniforms(5, 3, ids, "qsgd", 9),
              uniforms(5, -1, ids, "step", 9), uniforms(2**40 + 5, 3, ids, "step", 9)]
    for other in others:  # seed, round, purpose and the seed's high word each change every draw
        assert not np.isin(other, every).any()


@pytest.mark.parametrize("device", [None, *DEVICES])
def test_groups_drawn_at_once_get_each_groups_own_draws(device):
    """One evaluation of Philox over groups of clients with their own counts (a batch's size classes) gives each group
    what `uniforms` gives it alone, bit for bit, on the host and on a device; an empty group gets [0, n]."""
    rng = np.random.default_rng(2)
    keys = Keys(2**40 + 5, 7, rng.choice(2**32 - 2, 60, replace=False), "step")
    groups = [np.arange(0, 60, 3), np.array([1, 59]), np.array([], dtype=np.int64), np.arange(2, 40)]
    counts = [9, 40, 5, 1]
    for g, n, got in zip(groups, counts, keys.grouped_uniforms(groups, counts, device)):
        alone = uniforms(keys.seed, keys.round, keys.clients[g], "step", n)
        assert got.shape == (len(g), n) and (device is None) == isinstance(got, np.ndarray)
        assert (got if device is None else got.cpu().numpy()).tobytes() == alone.tobytes()


def test_the_draws_bits_are_the_top_53_of_each_counters_words_and_the_uniforms_times_2_53():
    """`grouped_bits` (the batch plans' sort keys): draw 2j and 2j+1 of client c are the top 53 bits of Philox's words
    (w0, w1) and (w2, w3) at counter (j, c + 1, round + 1, CRC-32 of the purpose), and the uniforms are them / 2^53."""
    keys = Keys(2**40 + 5, 7, np.array([3, 2**32 - 2, 0]), "step")
    groups, counts = [np.array([2, 0]), np.array([1])], [5, 2]
    for g, n, bits in zip(groups, counts, keys.grouped_bits(groups, counts)):
        assert bits.dtype == np.int64 and bits.shape == (len(g), n)
        np.testing.assert_array_equal(bits * 2.0**-53, uniforms(keys.seed, keys.round, keys.clients[g], "step", n))
        for row, c in zip(bits, keys.clients[g]):
            for j in range(n):
                counter = (j // 2, int(c) + 1, keys.round + 1, zlib.crc32(b"step"))
                words = [int(w[0]) for w in philox4x32(tuple(np.array([v]) for v in counter), (5, 2**8))]
                hi, lo = words[2 * (j % 2)], words[2 * (j % 2) + 1]
                assert row[j] == ((hi << 32) | lo) >> 11


def test_draws_are_uniform():
    """Kolmogorov-Smirnov against U[0, 1) over 10^5 draws of 10^4 clients (p > 1e-4), and the mean of the
    product of consecutive draws 1/4 within 5 standard errors (no lag-1 correlation)."""
    u = uniforms(0, 1, np.arange(10_000), "step", 10)
    assert stats.kstest(u.ravel(), "uniform").pvalue > 1e-4
    lag = (u[:, :-1] * u[:, 1:]).ravel()
    assert abs(lag.mean() - 0.25) < 5 * lag.std() / np.sqrt(lag.size)
    assert u.min() >= 0.0 and u.max() < 1.0


def test_keys_of_stream_generators_are_theirs():
    rngs = [stream(3, 2, c, "step") for c in (4, 9)]
    keys = Keys.of(rngs)
    assert (keys.seed, keys.round, keys.clients.tolist(), keys.purpose) == (3, 2, [4, 9], "step")
    np.testing.assert_array_equal(keys.uniforms(5), uniforms(3, 2, np.array([4, 9]), "step", 5))
    with pytest.raises(ValueError, match="share seed, round and purpose"):
        Keys.of([stream(3, 2, 4, "step"), stream(3, 3, 9, "step")])
    plain = Keys.of([np.random.default_rng(1)])  # a caller's own Generator: a key drawn from it, reproducibly
    assert plain == Keys.of([np.random.default_rng(1)])
