"""A fixed reduction tree over client ids, so pre-reduced replies sum to the same bits however the
clients are spread over shards.

The tree is the perfect binary tree over ids 0..2^k-1; a node is an aligned block (start, size).
A node's value is `combine(left, right)` of its children's values, or the one child that has
clients, so it depends only on which clients replied and never on who computed it. A shard
computes the nodes that lie wholly in its own ids; the server completes the tree from them.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Iterable

Part = tuple[int, int, Any]  # (start, size, value) of an aligned block


def root_size(num_clients: int) -> int:
    """The size of the tree's root block: the least power of two covering every client id."""
    return 1 << max(num_clients - 1, 0).bit_length()


def cover(ids: Iterable[int], num_clients: int) -> list[tuple[int, int]]:
    """The largest aligned blocks that hold only ids in `ids` and together hold all of them."""
    blocks, top = [], root_size(num_clients)
    ordered = sorted(set(ids))
    i = 0
    while i < len(ordered):
        lo = j = ordered[i]
        while i < len(ordered) and ordered[i] == j:  # one run of consecutive ids [lo, j)
            i, j = i + 1, j + 1
        while lo < j:
            size = lo & -lo if lo else top
            while size > j - lo:
                size //= 2
            blocks.append((lo, size))
            lo += size
    return blocks


def tree_reduce(parts: list[Part], start: int, size: int, combine: Callable[[Any, Any], Any]) -> Any | None:
    """The value of block (start, size) from disjoint aligned `parts` (None if none lies in it). The parts are
    sorted once and each node finds its own by bisection; a node holding one part is that part's value."""
    ordered = sorted(parts, key=lambda p: p[0])
    starts = [p[0] for p in ordered]

    def node(lo: int, hi: int, start: int, size: int) -> Any | None:  # ordered[lo:hi] lie in the block
        if hi - lo <= 1:
            return ordered[lo][2] if hi > lo else None
        half = size // 2
        mid = bisect.bisect_left(starts, start + half, lo, hi)
        left, right = node(lo, mid, start, half), node(mid, hi, start + half, half)
        if left is None or right is None:
            return right if left is None else left
        return combine(left, right)

    return node(bisect.bisect_left(starts, start), bisect.bisect_left(starts, start + size), start, size)


def reduce_owned(replies: dict[int, Any], blocks: list[tuple[int, int]], combine: Callable[[Any, Any], Any]) -> list[Part]:
    """A shard's part of the tree: the value of every block it owns (`cover` of its ids) that has replies."""
    leaves = [(c, 1, r) for c, r in replies.items()]
    parts = [(s, z, tree_reduce(leaves, s, z, combine)) for s, z in blocks]
    return [p for p in parts if p[2] is not None]
