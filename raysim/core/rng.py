"""Random streams keyed by (seed, round, client, purpose).

Every random draw in raysim comes from one of these streams, never from a global RNG, so the
same seed gives the same numbers whatever the number of actors, their packing or the order in
which they run. Round -1 and client -1 stand for "before the first round" and "the server".
"""
from __future__ import annotations

import zlib

import numpy as np
import torch

SERVER = -1
SETUP = -1


def _purpose_key(purpose: str) -> int:
    return zlib.crc32(purpose.encode("utf-8"))


def seed_sequence(seed: int, round: int, client: int, purpose: str) -> np.random.SeedSequence:
    """The SeedSequence of one stream; negative round/client ids are shifted to stay non-negative."""
    return np.random.SeedSequence([int(seed), int(round) + 1, int(client) + 1, _purpose_key(purpose)])


class KeyedGenerator(np.random.Generator):
    """A numpy Generator that also carries its key (seed, round, client, purpose), so code handed one client's
    generator can draw that client's counter-based numbers (raysim.core.keys) as a batch of clients would."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[int, int, int, str]):
        super().__init__(np.random.PCG64(seed_sequence(*key)))
        self.key = key


def stream(seed: int, round: int, client: int, purpose: str) -> np.random.Generator:
    """A numpy Generator for the stream (seed, round, client, purpose), carrying that key."""
    return KeyedGenerator((int(seed), int(round), int(client), purpose))


def torch_stream(seed: int, round: int, client: int, purpose: str) -> torch.Generator:
    """A CPU torch.Generator seeded from the same key as `stream`."""
    state = seed_sequence(seed, round, client, purpose).generate_state(2, dtype=np.uint32)
    g = torch.Generator()
    g.manual_seed(int(state[0]) << 31 ^ int(state[1]))
    return g
