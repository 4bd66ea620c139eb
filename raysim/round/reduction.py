"""A fixed reduction tree over client ids, so pre-reduced replies sum to the same bits however the
clients are spread over shards.

The tree is the perfect binary tree over ids 0..2^k-1; a node is an aligned block (start, size).
A node's value is `combine(left, right)` of its children's values, or the one child that has
clients, so it depends only on which clients replied and never on who computed it. A shard
computes the nodes that lie wholly in its own ids; the server completes the tree from them.
"""
from __future__ import annotations

import bisect
import dataclasses
from concurrent.futures import Executor
from typing import Any, Callable, Iterable

import numpy as np
import torch

from raysim.core import compiled
from raysim.core.device import as_rows, host

Part = tuple[int, int, Any]  # (start, size, value) of an aligned block


def root_size(num_clients: int) -> int:
    """The size of the tree's root block: the least power of two covering every client id."""
    return 1 << max(num_clients - 1, 0).bit_length()


def cover(ids: Iterable[int], num_clients: int) -> list[tuple[int, int]]:
    """The largest aligned blocks that hold only ids in `ids`, or ids from `num_clients` on (no client has one), and
    together hold all of them: the shard of the last clients owns the tree's empty right edge, so one shard of every
    client sends the root alone, not a block per bit of `num_clients`."""
    blocks, top = [], root_size(num_clients)
    if isinstance(ids, range) and ids.step == 1:  # a shard's clients: one run, with no Python int per id
        runs = [(ids.start, ids.stop)] if len(ids) else []
    else:
        ordered = np.unique(np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64))
        cut = np.flatnonzero(np.diff(ordered) != 1) + 1  # runs of consecutive ids [lo, j)
        runs = [(int(r[0]), int(r[-1]) + 1) for r in np.split(ordered, cut) if r.size]
    for lo, j in runs:
        j = top if j == num_clients else j
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
    return merge_parts([(c, 1, r) for c, r in replies.items()], blocks, combine)


def merge_parts(parts: list[Part], blocks: list[tuple[int, int]], combine: Callable[[Any, Any], Any]) -> list[Part]:
    """The value of every block of `blocks` that holds some of the finer `parts` (leaves, or the blocks a shard's
    chunks reduced): the nodes the server would compute from them, so the same bits, in fewer parts to send."""
    merged = [(s, z, tree_reduce(parts, s, z, combine)) for s, z in blocks]
    return [p for p in merged if p[2] is not None]


def reduce_stacked(ids: np.ndarray, stacked: Any, blocks: list[tuple[int, int]],
                   pool: Executor | None = None, threads: int = 1) -> list[Part]:
    """`reduce_owned` of replies stacked along a leading client axis (a dataclass whose fields are arrays or
    tensors over the clients `ids`) whose combine is the fieldwise sum: the same tree computed level by level for
    every block at once, each pair added left + right as the pairwise combine adds them, so the very same bits.
    A tensor is summed where it lives (a GPU shard's uploads on its GPU); only the blocks' values come back. With
    a `pool` of `threads` threads, a wide field on the CPU is summed a slice of its columns per thread (each element's adds, so
    its bits, unchanged)."""
    if not len(ids):
        return []
    ids = np.asarray(ids, dtype=np.int64)
    fields = {f.name: getattr(stacked, f.name) for f in dataclasses.fields(stacked)}
    on_host = not any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for v in fields.values())
    if on_host and len(ids) >= compiled.COMPILED_MIN and all(map(_compilable, fields.values())):
        vals, starts, sizes = _compiled_sums(ids, fields, blocks, pool, threads)
    else:
        order, pairs, nodes, starts, sizes = tree_schedule(ids, blocks)
        vals = {n: host(_tree_sums(v, order, pairs, nodes, pool, threads)) for n, v in fields.items()}
    return [(int(s), int(z), type(stacked)(**{n: _scalar(v[i]) for n, v in vals.items()})) for i, (s, z) in
            enumerate(zip(starts, sizes))]


HALF = (np.float16, torch.float16)  # numba has no half type on the CPU


def _compilable(v: Any) -> bool:
    """Whether the compiled tree sums field `v`: booleans, integers, single, double and complex numbers; a
    half-precision field (an algorithm's compressed uploads) is summed by tensor operations."""
    dtype = v.dtype if isinstance(v, (torch.Tensor, np.ndarray)) else np.asarray(v).dtype
    return dtype not in HALF and (isinstance(dtype, torch.dtype) or dtype.kind in "biufc")


def _compiled_sums(ids: np.ndarray, fields: dict[str, Any], blocks: list[tuple[int, int]], pool: Executor | None,
                   threads: int) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """`reduce_stacked`'s block values from the compiled tree (`tree_kernel`: one pass over the rows, no copy of
    them, no interpreter lock), with each block's (start, size); a wide field a slice of columns per thread."""
    from raysim.round.tree_kernel import block_sums  # numba's import and the kernel's load: 0.3-0.5 s, once
    order, rep, starts, sizes, block = _leaves(ids, blocks)
    first = block[np.flatnonzero(np.diff(block, prepend=-1))]  # each block with leaves, in id order

    def sums(part: np.ndarray) -> np.ndarray:
        return block_sums(part, order, rep, block, first.size)

    vals = {}
    for name, v in fields.items():
        rows = v.detach().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        slices = _column_slices(rows, threads if pool is not None else 1)
        done = list(pool.map(sums, slices)) if len(slices) > 1 and pool is not None else [sums(slices[0])]
        vals[name] = done[0] if len(done) == 1 else np.concatenate(done, axis=1)
    return vals, starts[first], sizes[first]


Schedule = tuple[np.ndarray | None, list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray, np.ndarray]


def tree_schedule(ids: np.ndarray, blocks: list[tuple[int, int]]) -> Schedule:
    """The tree over the clients `ids` within their owned `blocks`, planned on the host: the order that sorts the
    ids (None when sorted, as a round's are), each level's pairs (rows a, b: row a takes a + b; rows count the
    leaves in id order), and the rows that end up holding the nodes, with each node's block (start, size). From
    COMPILED_MIN ids the levels are compiled (`tree_kernel.schedule`: the same arrays)."""
    order, rep, starts, sizes, block = _leaves(ids, blocks)  # rep: a leaf id of each node, left to right
    if rep.size >= compiled.COMPILED_MIN:
        from raysim.round.tree_kernel import schedule
        pairs, row, block = schedule(rep, block, sizes[block])
        return order, pairs, row, starts[block], sizes[block]
    row = np.arange(rep.size)  # the row that holds each node's value
    limit = sizes[block]  # a node rises no higher than its owned block
    level, pairs = 0, []
    while rep.size > 1 and (2 << level) <= limit.max():
        parent = rep >> (level + 1)
        pair = (parent[:-1] == parent[1:]) & ((2 << level) <= limit[:-1])
        left = np.flatnonzero(pair)
        if left.size:  # only the paired rows move: a level costs its pairs, not the whole stack
            pairs.append((row[left], row[left + 1]))
            keep = np.ones(rep.size, dtype=bool)
            keep[left + 1] = False
            rep, block, limit, row = rep[keep], block[keep], limit[keep], row[keep]
        level += 1
    return order, pairs, row, starts[block], sizes[block]


def _leaves(ids: np.ndarray, blocks: list[tuple[int, int]]
            ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The tree's leaves in id order: the order that sorts `ids` (None when sorted, as a round's are), the sorted
    ids, the owned blocks' starts and sizes, and each leaf's block."""
    order = None if np.all(ids[1:] >= ids[:-1]) else np.argsort(ids, kind="stable")
    rep = ids if order is None else ids[order]
    starts = np.array([s for s, _ in blocks], dtype=np.int64)
    sizes = np.array([z for _, z in blocks], dtype=np.int64)
    return order, rep, starts, sizes, np.searchsorted(starts, rep, side="right") - 1


def _tree_sums(v: Any, order: np.ndarray | None, pairs: list[tuple[np.ndarray, np.ndarray]], nodes: np.ndarray,
               pool: Executor | None, threads: int) -> torch.Tensor:
    """The rows `nodes` after the levels `pairs` (row a += row b, a level at a time) over a field's rows (in `order`)."""
    if isinstance(v, torch.Tensor) and v.device.type != "cpu":
        return _device_tree_sums(v, order, pairs, nodes)
    t = _own_rows(v, order)  # our own copy, summed into in place
    steps = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in pairs]

    def apply(part: torch.Tensor) -> None:
        for a, b in steps:  # part[a] + part[b], in place: a single add per element, left + right
            part.index_add_(0, a, part.index_select(0, b))

    slices = _column_slices(t, threads if pool is not None else 1)
    if len(slices) > 1 and pool is not None:
        list(pool.map(apply, slices))
    else:
        apply(t)
    return t.index_select(0, torch.from_numpy(nodes))


def _device_tree_sums(v: torch.Tensor, order: np.ndarray | None, pairs: list[tuple[np.ndarray, np.ndarray]],
                      nodes: np.ndarray) -> torch.Tensor:
    """`_tree_sums` on a GPU, where an index_add_ is a sort under deterministic algorithms: each level's sums
    a + b (the same single add) go to fresh rows after the leaves, so a level is one gather and an add. The
    schedule travels in one transfer that does not wait for the GPU's queued work."""
    at = np.arange(len(v))  # where each row's current value lies in the buffer
    moves, fresh = [] if order is None else [order], len(v)
    for a, b in pairs:
        moves += [at[a], at[b]]
        at[a] = np.arange(fresh, fresh + a.size)
        fresh += a.size
    schedule = torch.from_numpy(np.concatenate(moves + [at[nodes]])).to(v.device, non_blocking=True)
    buf = v.new_empty((fresh, *v.shape[1:]))
    if order is None:
        buf[:len(v)].copy_(v)
    else:
        torch.index_select(v, 0, schedule[:len(v)], out=buf[:len(v)])
    i, out = (0 if order is None else len(v)), len(v)
    for a, _ in pairs:
        k = a.size
        both = buf.index_select(0, schedule[i:i + 2 * k])  # the level's a rows, then its b rows: one gather
        torch.add(both[:k], both[k:], out=buf[out:out + k])
        i, out = i + 2 * k, out + k
    return buf.index_select(0, schedule[i:])


MIN_COLUMNS = 1024  # columns of a field worth a thread of their own in the reduction


def _column_slices(t: Any, threads: int) -> list[Any]:
    """Views of a CPU field's column slices (a tensor's or an array's), one per thread (of `threads`) that has
    MIN_COLUMNS of them (else t)."""
    on_gpu = isinstance(t, torch.Tensor) and t.device.type != "cpu"
    n = 1 if on_gpu or t.ndim != 2 else min(threads, t.shape[1] // MIN_COLUMNS)
    if n <= 1:
        return [t]
    bounds = np.linspace(0, t.shape[1], n + 1).astype(int)
    return [t[:, lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]


def _own_rows(v: Any, order: np.ndarray | None) -> torch.Tensor:
    """A writable copy of a field's rows (in `order` when given), as a tensor where the field lives."""
    if isinstance(v, torch.Tensor):
        return v.clone() if order is None else v.index_select(0, torch.from_numpy(order).to(v.device))
    return torch.from_numpy(np.array(v) if order is None else np.asarray(v)[order])


def take_rows(stacked: Any, index: np.ndarray) -> Any:
    """The rows `index` of a stacked reply (every field's leading client axis)."""
    return type(stacked)(**{f.name: as_rows(getattr(stacked, f.name), index) for f in dataclasses.fields(stacked)})


def concat_rows(parts: list[Any]) -> Any:
    """Stacked replies of disjoint clients as one, in order (every field's leading client axis joined)."""
    first = parts[0]
    return type(first)(**{f.name: _concat([getattr(p, f.name) for p in parts]) for f in dataclasses.fields(first)})


def _concat(values: list[Any]) -> Any:
    return torch.cat(values) if isinstance(values[0], torch.Tensor) else np.concatenate([np.asarray(v) for v in values])


def unstack(stacked: Any, k: int) -> list:
    """A stacked reply as k per-client replies (NumPy, in host memory)."""
    fields = {f.name: host(getattr(stacked, f.name)) for f in dataclasses.fields(stacked)}
    return [type(stacked)(**{n: _scalar(v[i]) for n, v in fields.items()}) for i in range(k)]


def _scalar(v: Any) -> Any:
    """A numpy scalar as the Python number a pairwise combine of Python floats would give; arrays unchanged."""
    return v.item() if isinstance(v, np.generic) else v
