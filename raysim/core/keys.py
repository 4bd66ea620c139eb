"""Counter-based random numbers for many clients at once: Philox4x32-10 (Salmon et al., "Parallel random numbers:
as easy as 1, 2, 3", SC 2011), the generator JAX and cuRAND use, evaluated over arrays of counters.

A draw is a pure function of (seed, round, client, purpose, index), so a round's draws for 10^4 clients are one
vectorized call, and any one client's draws are the same numbers whichever clients share its shard, in which
order they run, or whether they are drawn alone. The counter is (index block, client + 1, round + 1,
CRC-32 of the purpose) and the key the seed's two 32-bit halves; round -1 and client -1 (SETUP, SERVER) map to 0.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # Philox4x32's round multipliers
WEYL = (0x9E3779B9, 0xBB67AE85)  # its key's increments a round
ROUNDS = 10
_LOW = 0xFFFFFFFF

Words = tuple[Any, Any, Any, Any]  # four arrays of 32-bit words: NumPy's uint32, torch's int64


def philox4x32(counter: Words, key: tuple[int, int]) -> Words:
    """Philox4x32-10 of the counters `counter` under `key`: the Random123 reference's output word for word.

    The words are NumPy arrays or torch tensors (on any device); NumPy's come back as uint32 (`_philox_host`),
    torch's as int64: a 32x32-bit product wraps in int64 with the same 64 bits as the unsigned product, and masking
    after the arithmetic shift recovers its high word, so the one formula runs where a GPU shard's tensors live.
    Torch's words go two to an array (the multiplied pair, the XORed pair): six launches a round instead of ten,
    where launches cost a GPU more than the elements."""
    on = next((w.device for w in counter if isinstance(w, torch.Tensor)), None)
    if on is not None:
        return _philox_lanes(counter, key, on)
    return _philox_host(counter, key)


def _philox_host(counter: Words, key: tuple[int, int]) -> Words:
    """`philox4x32` in NumPy over uint32 words (counter words broadcast together). Each round's two products land in
    uint64 buffers read through uint32 views, so a product's high and low words cost no shift and no mask: six array
    operations a round instead of ten (1.2-1.4x faster, and fewer calls for threads to take turns at)."""
    shape = np.broadcast_shapes(*[np.shape(w) for w in counter])
    c0, c1, c2, c3 = (np.asarray(w).astype(np.uint32, copy=False) for w in counter)
    k0, k1 = key
    m0, m1 = (np.uint64(m) for m in MULTIPLIERS)
    products = [np.empty(shape, dtype=np.uint64) for _ in range(4)]  # [p0, p1] of one round, then of the next
    halves = [p.view(np.uint32) for p in products]  # little-endian: a product's low word first
    high, low = [h[..., 1::2] for h in halves], [h[..., 0::2] for h in halves]
    x0, x2 = np.empty(shape, dtype=np.uint32), np.empty(shape, dtype=np.uint32)
    now = 0
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + WEYL[0]) & _LOW, (k1 + WEYL[1]) & _LOW
            c0, c2, c1, c3 = x0, x2, low[now + 1], low[now]  # the last round's words; its products' low words
            now = 2 - now
        np.multiply(c0, m0, out=products[now], dtype=np.uint64)
        np.multiply(c2, m1, out=products[now + 1], dtype=np.uint64)
        np.bitwise_xor(high[now + 1], c1, out=x0)
        x0 ^= np.uint32(k0)
        np.bitwise_xor(high[now], c3, out=x2)
        x2 ^= np.uint32(k1)
    return x0, low[now + 1], x2, low[now]


def _philox_lanes(counter: Words, key: tuple[int, int], on: torch.device) -> Words:
    """`philox4x32` of torch words with [c0, c2] and [c1, c3] as the two lanes of one tensor each."""
    shape = torch.broadcast_shapes(*[w.shape for w in counter if isinstance(w, torch.Tensor)])
    steps = np.arange(ROUNDS, dtype=np.int64)[:, None] * np.array(WEYL, dtype=np.int64)
    # the multipliers, then each round's key, in one transfer
    host = np.concatenate([[MULTIPLIERS], (np.array(key, dtype=np.int64) + steps) & _LOW]).astype(np.int64)
    consts = torch.from_numpy(host.reshape(ROUNDS + 1, 2, *[1] * len(shape))).to(on, non_blocking=True)
    # a word given as a number is filled in where the tensors live (no transfer, so no wait)
    t = [w.expand(shape) if isinstance(w, torch.Tensor) else torch.full(shape, int(w), dtype=torch.int64, device=on)
         for w in counter]
    a, b = torch.stack([t[0], t[2]]), torch.stack([t[1], t[3]])
    for r in range(ROUNDS):
        q = (a * consts[0]).flip(0)  # [p1, p0]: the next round's [c1, c3], unmasked
        a, b = ((q >> 32) ^ b ^ consts[r + 1]) & _LOW, q
    return a[0], b[0] & _LOW, a[1], b[1] & _LOW


def purpose_word(purpose: str) -> int:
    """The counter word that names a purpose ("step", "qsgd", ...)."""
    return zlib.crc32(purpose.encode("utf-8"))


def key_words(seed: int, round: int, purpose: str) -> tuple[int, int, int, int]:
    """The words a draw's counter and key take from (seed, round, purpose): the counter's round and purpose words,
    then the key's two, the seed's low and high 32 bits."""
    return (int(round) + 1) & _LOW, purpose_word(purpose), int(seed) & _LOW, (int(seed) >> 32) & _LOW


def uniforms(seed: int, round: int, clients: np.ndarray, purpose: str, n: int, device: Any = None) -> Any:
    """n uniforms in [0, 1) for each client: [k, n] float64 with 53 random bits each, draw j of client c a function
    of (seed, round, c, purpose, j) only. A NumPy array, or with `device` the same numbers as a tensor there."""
    return grouped_uniforms(seed, round, [clients], purpose, [n], device)[0]


def grouped_uniforms(seed: int, round: int, groups: list[np.ndarray], purpose: str, counts: list[int],
                     device: Any = None) -> list[Any]:
    """`uniforms(seed, round, groups[g], purpose, counts[g])` of each group g of clients, from one evaluation of
    Philox over all of their counters (a GPU's launches, the host's array calls, once for every group)."""
    bits = _draw_bits(seed, round, groups, purpose, counts, device)
    both = bits.astype(np.float64) if device is None else bits.to(torch.float64)
    return _split(both * 2.0**-53, groups, counts)


def grouped_bits(seed: int, round: int, groups: list[np.ndarray], purpose: str, counts: list[int]) -> list[np.ndarray]:
    """`grouped_uniforms` on the host as the integers behind them: int64 in [0, 2^53), each uniform times 2^53
    exactly, so they order as the uniforms do (a sort's keys without the conversion)."""
    return _split(_draw_bits(seed, round, groups, purpose, counts, None), groups, counts)


def _draw_bits(seed: int, round: int, groups: list[np.ndarray], purpose: str, counts: list[int], device: Any) -> Any:
    """The 53-bit integers of every group's draws from one Philox evaluation: [counters, 2], group after group,
    each group's rows client by client, two draws a counter."""
    blocks = [_blocks(n) for n in counts]
    ids = [np.asarray(c, dtype=np.int64).reshape(-1) for c in groups]
    cat: Any  # np.concatenate or torch.cat
    spread: Callable[[Any, np.ndarray, int], Any]  # a group's words, broadcast over its counters, flat
    if device is None:
        # each group's client words and block words, uint32 as `_philox_host` takes them (no copy of every counter)
        columns: list[Any] = [((c + 1) & _LOW).astype(np.uint32)[:, None] for c in ids]
        rows: list[Any] = [np.arange(b, dtype=np.uint32)[None, :] for b in blocks]
        spread, cat = (lambda v, c, b: np.broadcast_to(v, (c.size, b)).reshape(-1)), np.concatenate
    else:  # the clients' ids in one transfer that does not wait for the device's queued work; the rest formed there
        every = torch.from_numpy(np.concatenate(ids) + 1).to(device, non_blocking=True) & _LOW
        columns = [col[:, None] for col in torch.split(every, [c.size for c in ids])]
        rows = [torch.arange(b, dtype=torch.int64, device=device)[None, :] for b in blocks]
        spread, cat = (lambda v, c, b: v.expand(c.size, b).reshape(-1)), torch.cat
    if len(ids) == 1:  # one group's words broadcast (a column of clients, a row of blocks): nothing materialized
        block, client = rows[0], columns[0]
    else:  # several groups' counters laid out flat, group after group
        block = cat([spread(r, c, b) for r, c, b in zip(rows, ids, blocks)])
        client = cat([spread(v, c, b) for v, c, b in zip(columns, ids, blocks)])
    round_word, purpose_bits, k0, k1 = key_words(seed, round, purpose)
    w0, w1, w2, w3 = philox4x32((block, client, round_word, purpose_bits), (k0, k1))
    # a double's 53 bits from two words: the top 53 of their 64 (hi << 21 | lo >> 11), exact in int64 and float64
    if device is not None:
        return torch.stack(((w0 << 21) | (w1 >> 11), (w2 << 21) | (w3 >> 11)), -1).reshape(-1, 2)
    bits = np.empty((*w0.shape, 2), dtype=np.int64)
    for j, (hi, lo) in enumerate(((w0, w1), (w2, w3))):
        np.left_shift(hi, 21, out=bits[..., j], dtype=np.int64)
        bits[..., j] |= lo >> 11
    return bits.reshape(-1, 2)


def _blocks(n: int) -> int:
    """The counters behind n draws: one Philox call gives 128 bits, two doubles."""
    return (int(n) + 1) // 2


def _split(both: Any, groups: list[np.ndarray], counts: list[int]) -> list[Any]:
    """Each group's [clients, count] of the rows `_draw_bits` laid out (or of their uniforms)."""
    out, at = [], 0
    for c, n in zip(groups, counts):
        k, b = np.size(c), _blocks(n)
        out.append(both[at:at + k * b].reshape(k, 2 * b)[:, :n])
        at += k * b
    return out


@dataclass(frozen=True)
class Keys:
    """The random keys of a batch of clients for one purpose of one round: (seed, round, clients[k], purpose)."""

    seed: int
    round: int
    clients: np.ndarray
    purpose: str

    @classmethod
    def of(cls, rngs: list[np.random.Generator]) -> Keys:
        """The keys behind per-client generators made by `raysim.core.rng.stream` (which carry theirs); a generator
        without one gives a key drawn from it, so a caller's own Generator still gives reproducible draws."""
        keys = [getattr(r, "key", None) or (int(r.integers(2**63)), 0, i, "step") for i, r in enumerate(rngs)]
        seed, round, _, purpose = keys[0]
        if any((k[0], k[1], k[3]) != (seed, round, purpose) for k in keys):  # one call of uniforms serves them all
            raise ValueError("Keys.of: the generators must share seed, round and purpose")
        return cls(seed, round, np.array([k[2] for k in keys], dtype=np.int64), purpose)

    def uniforms(self, n: int, purpose: str | None = None, device: Any = None) -> Any:
        """n uniforms in [0, 1) for every client, [k, n]; `purpose` names another stream of the same clients; with
        `device`, as a tensor there."""
        return uniforms(self.seed, self.round, self.clients, purpose or self.purpose, n, device)

    def grouped_uniforms(self, groups: list[np.ndarray], counts: list[int], device: Any = None) -> list[Any]:
        """`uniforms(counts[g])` of the clients at positions `groups[g]` of these keys, for every group at once."""
        return grouped_uniforms(self.seed, self.round, [self.clients[g] for g in groups], self.purpose, counts, device)

    def grouped_bits(self, groups: list[np.ndarray], counts: list[int]) -> list[np.ndarray]:
        """`grouped_uniforms` on the host as their 53-bit integers (`grouped_bits`)."""
        return grouped_bits(self.seed, self.round, [self.clients[g] for g in groups], self.purpose, counts)

    def __len__(self) -> int:
        return len(self.clients)
