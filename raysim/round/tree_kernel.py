"""The reduction tree's sums compiled (numba): a shard's rows summed block by block in one pass over them, with no
interpreter lock and no copy of the rows. Walking the leaves in id order with a stack of finished subtrees adds
exactly the pairs the tree adds (each node's left value + its right value, a node with one side passing that side
up), so the bits are `reduction.reduce_stacked`'s on every path."""
from __future__ import annotations

import numpy as np

from raysim.core.compiled import jit

DEPTH = 66  # a stack's subtrees at most: one per level of a 64-bit id, and the new leaf


@jit()
def _block_sums(rows, order, ids, block, out):
    """out[i] = the tree's value of the i-th block that holds leaves: leaf j is rows[order[j]] with id ids[j]
    (ascending) in block block[j]. A leaf's gap to the previous one, a ^ b, has the bit length of the level of their
    lowest common node; before a leaf is pushed, the subtrees above a lower gap merge, the newest pair first (the
    deepest node), so every node adds its two children's values once, left + right."""
    stack = np.empty((DEPTH, rows.shape[1]), dtype=rows.dtype)
    gaps = np.empty(DEPTH, dtype=np.int64)
    top, at = 0, 0
    for j in range(ids.size):
        if j and block[j] != block[j - 1]:  # a block's leaves are done: its stack merges into its value
            _merge(stack, top, 1)
            _copy(stack[0], out[at])
            top, at = 0, at + 1
        gap = ids[j - 1] ^ ids[j] if top else 0  # a block's first leaf: no gap below it is read
        while top >= 2 and _lower(gaps[top - 1], gap):
            _merge(stack, top, top - 1)
            top -= 1
        _copy(rows[order[j]], stack[top])
        gaps[top] = gap
        top += 1
    if top:
        _merge(stack, top, 1)
        _copy(stack[0], out[at])


@jit(inline="always")
def _merge(stack, top, keep):
    """The stack's newest subtrees merged pairwise, newest pair first (left + right), until `keep` remain."""
    for t in range(top - 1, keep - 1, -1):
        for c in range(stack.shape[1]):
            stack[t - 1, c] += stack[t, c]


@jit(inline="always")
def _copy(row, to):
    """to[:] = row, as a loop (a slice assignment compiles seconds longer)."""
    for c in range(row.size):
        to[c] = row[c]


@jit(inline="always")
def _lower(a, b):
    """Whether a's highest set bit is below b's."""
    return a < b and a < (a ^ b)


def block_sums(rows: np.ndarray, order: np.ndarray | None, ids: np.ndarray, block: np.ndarray, blocks: int) -> np.ndarray:
    """The tree's value of each block that holds leaves, in id order ([blocks, ...] of a field's rows [k, ...]):
    `order` puts the rows in the order of the ascending `ids` (None: they are), `block` is each leaf's block."""
    flat = rows.reshape(len(rows), -1)
    out = np.empty((blocks, flat.shape[1]), dtype=flat.dtype)
    ranks = np.arange(len(rows), dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
    _block_sums(flat, ranks, np.asarray(ids, dtype=np.int64), np.asarray(block, dtype=np.int64), out)
    return out.reshape(blocks, *rows.shape[1:])


@jit()
def _schedule(rep, block, limit, left, right, ends):
    """`reduction.tree_schedule`'s levels in one pass a level over the leaves (ids `rep` ascending, each in owned
    block `block` of size `limit`): a node pairs with the next when they share a parent and its block holds the
    parent; the pair's rows go to left/right, each level's end (of levels that pair any) to `ends`. Returns the
    count of nodes, pairs and levels, and each node's row and block."""
    rep, block, limit = rep.copy(), block.copy(), limit.copy()
    row = np.arange(rep.size)
    top = limit.max() if rep.size else 0
    nodes, pairs, levels, level = rep.size, 0, 0, 0
    while nodes > 1 and (2 << level) <= top:
        i, kept, first = 0, 0, pairs
        while i < nodes:
            step = 1
            if i + 1 < nodes and (2 << level) <= limit[i] and rep[i] >> (level + 1) == rep[i + 1] >> (level + 1):
                left[pairs], right[pairs] = row[i], row[i + 1]
                pairs, step = pairs + 1, 2
            rep[kept], block[kept], limit[kept], row[kept] = rep[i], block[i], limit[i], row[i]
            i, kept = i + step, kept + 1
        if pairs > first:
            ends[levels] = pairs
            levels += 1
        nodes, level = kept, level + 1
    return nodes, pairs, levels, row[:nodes], block[:nodes]


def schedule(rep: np.ndarray, block: np.ndarray, limit: np.ndarray) -> tuple[list[tuple[np.ndarray, np.ndarray]],
                                                                             np.ndarray, np.ndarray]:
    """`reduction.tree_schedule`'s pairs a level, the rows that hold the nodes and each node's block, compiled: the
    same arrays as its NumPy levels (a GPU shard's 10^4 clients: a few NumPy calls a level for 14 levels)."""
    k = rep.size
    left, right, ends = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64), np.empty(DEPTH, dtype=np.int64)
    _, _, levels, row, block = _schedule(np.asarray(rep, dtype=np.int64), np.asarray(block, dtype=np.int64),
                                         np.asarray(limit, dtype=np.int64), left, right, ends)
    cuts = [0, *ends[:levels].tolist()]
    return [(left[a:b], right[a:b]) for a, b in zip(cuts[:-1], cuts[1:])], row, block
