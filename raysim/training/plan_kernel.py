"""The host's batch plans compiled (numba): client by client, its keyed Philox draws, each pass's stable sort of
them and its steps' sample indices, in one call that holds no interpreter lock, so a shard's chunk threads draw
their plans at once instead of taking turns at thousands of small NumPy calls. The very plans `batch_plans` gives
on every path, bit for bit (Salmon et al., SC 2011, for Philox4x32-10)."""
from __future__ import annotations

import threading

import numpy as np
from numba import get_num_threads, prange

from raysim.core.compiled import host_threads, jit
from raysim.core.keys import MULTIPLIERS, ROUNDS, WEYL, Keys, key_words

_M0, _M1 = np.uint64(MULTIPLIERS[0]), np.uint64(MULTIPLIERS[1])
_W0, _W1 = np.uint32(WEYL[0]), np.uint32(WEYL[1])
_HIGH, _LOW = np.uint64(32), np.uint64(0xFFFFFFFF)
INSERTION_MAX = 32  # a pass is sorted by insertion in runs of this many samples, the runs then merged


@jit(inline="always")
def philox(c0, c1, c2, c3, k0, k1):
    """`keys.philox4x32` of one counter (uint32 words) under the key (k0, k1): its four output words."""
    for _ in range(ROUNDS):
        p0 = np.uint64(c0) * _M0
        p1 = np.uint64(c2) * _M1
        c0 = np.uint32(p1 >> _HIGH) ^ c1 ^ k0
        c2 = np.uint32(p0 >> _HIGH) ^ c3 ^ k1
        c1 = np.uint32(p1 & _LOW)
        c3 = np.uint32(p0 & _LOW)
        k0 = np.uint32(k0 + _W0)
        k1 = np.uint32(k1 + _W1)
    return c0, c1, c2, c3


@jit(inline="always")  # inlined into `_fill`: called, it cost a tenth of the plans
def stable_order(keys, at, n, out, spare):
    """out[at:at + n] = np.argsort(keys[at:at + n], kind="stable") (equal keys in position order), with spare[at:at
    + n] to merge into: by insertion up to INSERTION_MAX keys, else `_merge_sort`."""
    if n > INSERTION_MAX:
        _merge_sort(keys, at, n, out, spare)
        return
    _insertion(keys, at, 0, n, out)


@jit(inline="always")
def _insertion(keys, at, lo, hi, out):
    """out[at + lo:at + hi] = lo..hi-1 in the stable order of their keys: a position moves past larger keys only."""
    for j in range(lo, hi):
        key, q = keys[at + j], j - 1
        while q >= lo and keys[at + out[at + q]] > key:
            out[at + q + 1] = out[at + q]
            q -= 1
        out[at + q + 1] = j


@jit()
def _merge_sort(keys, at, n, out, spare):
    """`stable_order` of a long pass: runs of INSERTION_MAX sorted by insertion, then merged pairwise, a left run's
    key taken first when equal. Our own: numba's np.argsort(kind="mergesort") compiles 3 s longer."""
    for lo in range(0, n, INSERTION_MAX):
        _insertion(keys, at, lo, min(lo + INSERTION_MAX, n), out)
    src, dst, width, in_spare = out, spare, INSERTION_MAX, False
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j = lo, mid
            for m in range(lo, hi):
                if j >= hi or (i < mid and keys[at + src[at + i]] <= keys[at + src[at + j]]):
                    dst[at + m] = src[at + i]
                    i += 1
                else:
                    dst[at + m] = src[at + j]
                    j += 1
        src, dst, width, in_spare = dst, src, 2 * width, not in_spare
    if in_spare:  # the last merge wrote to spare (a loop: a slice assignment compiles 2 s longer)
        for m in range(n):
            out[at + m] = spare[at + m]


@jit()
def _fill(clients, n, b, per_epoch, steps, round_word, purpose_word, k0, k1, idx, w):
    """idx, w [k, S, width] of the clients' plans: client i's draw j is the top 53 bits of Philox's words 0-1 (j
    even) or 2-3 (j odd) at counter (j // 2, client + 1, round word, purpose word); pass e's permutation is the
    stable order of draws e n .. e n + n - 1, and step s takes positions (s mod steps a pass) b + t of pass
    s // steps a pass."""
    k, S, width = idx.shape
    longest = 1
    for i in range(k):
        longest = max(longest, (steps[i] + per_epoch[i] - 1) // per_epoch[i] * n[i])
    draws = np.empty(longest + 1, dtype=np.int64)
    perm, spare = np.empty(longest, dtype=np.int64), np.empty(longest, dtype=np.int64)
    rw, pw, key0, key1 = np.uint32(round_word), np.uint32(purpose_word), np.uint32(k0), np.uint32(k1)
    for i in range(k):
        ni, bi, pe, si = n[i], b[i], per_epoch[i], steps[i]
        passes = (si + pe - 1) // pe
        cw = np.uint32((clients[i] + 1) & 0xFFFFFFFF)
        for block in range((passes * ni + 1) // 2):
            x0, x1, x2, x3 = philox(np.uint32(block), cw, rw, pw, key0, key1)
            draws[2 * block] = (np.int64(x0) << 21) | (np.int64(x1) >> 11)
            draws[2 * block + 1] = (np.int64(x2) << 21) | (np.int64(x3) >> 11)
        for e in range(passes):
            stable_order(draws, e * ni, ni, perm, spare)
        for s in range(S):
            e, first = s // pe, s % pe * bi
            for t in range(width):
                valid = s < si and t < bi and first + t < ni
                idx[i, s, t] = perm[e * ni + first + t] if valid else 0
                w[i, s, t] = 1.0 if valid else 0.0


def host_plans(n: np.ndarray, b: np.ndarray, per_epoch: np.ndarray, steps: np.ndarray, keys: Keys, S: int,
               width: int) -> tuple[np.ndarray, np.ndarray]:
    """`batch_plans` on the host, compiled: the sample indices [k, S, width] (int64) and their weights (float64)."""
    idx = np.empty((len(n), S, width), dtype=np.int64)
    w = np.empty((len(n), S, width), dtype=np.float64)
    _fill(*_inputs(n, b, per_epoch, steps, keys), idx, w)
    return idx, w


Inputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int, int, int]


def _inputs(n: np.ndarray, b: np.ndarray, per_epoch: np.ndarray, steps: np.ndarray, keys: Keys) -> Inputs:
    """`_fill`'s leading arguments: the clients' ids, sizes, batches, steps a pass and steps (int64), then the key's
    round, purpose and seed words."""
    clients, sizes, batch, a_pass, taken = (np.ascontiguousarray(a, dtype=np.int64)
                                            for a in (keys.clients, n, b, per_epoch, steps))
    return (clients, sizes, batch, a_pass, taken, *key_words(keys.seed, keys.round, keys.purpose))


PART_MIN = 256  # clients a thread of `device_host_plans` takes at least
_ONE_CALL = threading.Lock()  # numba's fallback threading layer (workqueue) aborts on concurrent parallel calls


@jit(parallel=True)
def _fill_parts(clients, n, b, per_epoch, steps, round_word, purpose_word, k0, k1, idx, w, parts):
    """`_fill` of `parts` consecutive slices of the clients, one a thread (each client's plan is its own, so the
    slices do not change a bit)."""
    k = clients.size
    for p in prange(parts):
        lo, hi = p * k // parts, (p + 1) * k // parts
        _fill(clients[lo:hi], n[lo:hi], b[lo:hi], per_epoch[lo:hi], steps[lo:hi], round_word, purpose_word, k0, k1,
              idx[lo:hi], w[lo:hi])


def device_host_plans(n: np.ndarray, b: np.ndarray, per_epoch: np.ndarray, steps: np.ndarray, keys: Keys, S: int,
                      width: int) -> tuple[np.ndarray, np.ndarray]:
    """`host_plans` for an accelerator's shard, on numba's threads at once (up to the process's CPU share,
    `compiled.use_host_threads`) and in the narrow types a copy to the device moves fastest: the sample indices as
    int32 (positions within a client) and the weights as uint8."""
    k = len(n)
    idx = np.empty((k, S, width), dtype=np.int32 if int(np.max(n, initial=0)) < 2**31 else np.int64)
    w = np.empty((k, S, width), dtype=np.uint8)
    parts = max(1, min(host_threads(get_num_threads()), k // PART_MIN))
    with _ONE_CALL:
        _fill_parts(*_inputs(n, b, per_epoch, steps, keys), idx, w, parts)
    return idx, w
