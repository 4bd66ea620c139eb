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

import numpy as np

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)  # the round multipliers
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)  # the Weyl key increments
_LOW = np.uint64(0xFFFFFFFF)
_ROUNDS = 10


def philox4x32(counter: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Philox4x32-10 of `counter` [..., 4] under `key` [..., 2] (uint32, broadcast against each other): [..., 4]
    uint32, the Random123 reference's output word for word."""
    c = np.asarray(counter, dtype=np.uint32)
    k = np.asarray(key, dtype=np.uint32)
    c0, c1, c2, c3 = (c[..., i] for i in range(4))
    k0, k1 = np.array(k[..., 0]), np.array(k[..., 1])
    for r in range(_ROUNDS):
        if r:
            with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as the reference's does
                k0, k1 = k0 + _W0, k1 + _W1
        p0 = _M0 * c0.astype(np.uint64)
        p1 = _M1 * c2.astype(np.uint64)
        hi0, lo0 = (p0 >> np.uint64(32)).astype(np.uint32), (p0 & _LOW).astype(np.uint32)
        hi1, lo1 = (p1 >> np.uint64(32)).astype(np.uint32), (p1 & _LOW).astype(np.uint32)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack([c0, c1, c2, c3], axis=-1)


def purpose_word(purpose: str) -> int:
    """The counter word that names a purpose ("step", "qsgd", ...)."""
    return zlib.crc32(purpose.encode("utf-8"))


def uniforms(seed: int, round: int, clients: np.ndarray, purpose: str, n: int) -> np.ndarray:
    """n uniforms in [0, 1) for each client: [k, n] float64 with 53 random bits each, draw j of client c a function
    of (seed, round, c, purpose, j) only."""
    ids = np.asarray(clients, dtype=np.int64).reshape(-1)
    blocks = (n + 1) // 2  # one Philox call gives 128 bits: two doubles
    counter = np.empty((ids.size, blocks, 4), dtype=np.uint32)
    counter[..., 0] = np.arange(blocks, dtype=np.uint32)
    counter[..., 1] = (ids + 1).astype(np.uint32)[:, None]
    counter[..., 2] = np.uint32((int(round) + 1) & 0xFFFFFFFF)
    counter[..., 3] = np.uint32(purpose_word(purpose))
    key = np.array([int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF], dtype=np.uint32)
    words = philox4x32(counter, key).astype(np.uint64).reshape(ids.size, blocks * 2, 2)
    bits = (words[..., 0] << np.uint64(32)) | words[..., 1]
    return ((bits >> np.uint64(11)).astype(np.float64) * 2.0**-53)[:, :n]


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

    def uniforms(self, n: int, purpose: str | None = None) -> np.ndarray:
        """n uniforms in [0, 1) for every client, [k, n]; `purpose` names another stream of the same clients."""
        return uniforms(self.seed, self.round, self.clients, purpose or self.purpose, n)

    def __len__(self) -> int:
        return len(self.clients)
