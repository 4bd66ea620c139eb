"""A shard of logical clients: their data and estimator state, and their steps in a round. Only
(Reply, Cost) leaves it. The Ray client actor wraps it; the local backend calls it directly."""
from __future__ import annotations

import copy
import os
import pickle
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from raysim.contract import Algorithm, ClientBatch, ClientData, Costs, Steps, batched
from raysim.core import compiled
from raysim.core.device import deterministic_cuda
from raysim.core.keys import Keys
from raysim.core.rng import SERVER, stream
from raysim.data import FederatedData, read_client_block
from raysim.data.row_store import on_disk, read_rows_of
from raysim.models import DTYPES
from raysim.round.experiment import Experiment
from raysim.round.reduction import (Part, concat_rows, cover, merge_parts, reduce_owned, reduce_stacked, take_rows,
                                    unstack)
from raysim.storage import checkpoint
from raysim.system import SystemModel


@dataclass
class ShardResult:
    """What a shard sends back for a round, as columns over its clients: costs, sampled compute times and
    measured CPU seconds, and either every client's reply or (`parts`) its blocks of the reduction tree over
    the clients within the deadline (raysim.round.reduction): one part a block the shard owns, its chunks' finer
    blocks merged into it."""

    clients: np.ndarray
    costs: Costs
    compute_times: np.ndarray | None  # None: left to the server (they drop no client)
    replies: list
    cpu: np.ndarray | CpuSplit  # each client's measured CPU seconds, or the batched chunks' times they split
    parts: list[Part] = field(default_factory=list)

    @property
    def cpu_seconds(self) -> np.ndarray:
        """Each client's CPU seconds: a batched step's travel as its chunks' times (`CpuSplit`), split where read."""
        return self.cpu.of(self.costs.oracle_calls) if isinstance(self.cpu, CpuSplit) else self.cpu


@dataclass
class CpuSplit:
    """The CPU seconds of batched steps: each chunk's end among the round's clients and its seconds, split over its
    clients in proportion to their oracle calls (`of`). Two numbers a chunk, where the column is one a client."""

    ends: np.ndarray
    seconds: np.ndarray

    def of(self, calls: np.ndarray) -> np.ndarray:
        """Each client's CPU seconds, from the clients' oracle calls."""
        starts = np.concatenate(([0], self.ends[:-1]))
        return np.concatenate([_shares(calls[a:b], t) for a, b, t in zip(starts, self.ends, self.seconds)] or
                              [np.zeros(0)])


class ClientRows(Mapping[int, ClientData]):
    """A shard's clients as one block of rows with offsets: one pair of tensors for all of them, and a
    client's ClientData a view made when asked for, not a Python object per client held (10^6 clients)."""

    def __init__(self, ids: np.ndarray, offsets: np.ndarray, x: torch.Tensor, y: torch.Tensor):
        self.ids, self.offsets, self.x, self.y = ids, offsets, x, y
        # a shard's ids are a run (a range of clients): a client's position is then its id less the first
        self.first = int(ids[0]) if len(ids) and int(ids[-1]) - int(ids[0]) + 1 == len(ids) else None

    def _positions(self, clients: Any) -> Any:
        """Where `clients` (an id or an array of them) lie among this shard's ids (out of range, or not equal to them
        there, when not held)."""
        return clients - self.first if self.first is not None else np.searchsorted(self.ids, clients)

    def __getitem__(self, client: int) -> ClientData:
        i = int(self._positions(client))
        if not 0 <= i < len(self.ids) or self.ids[i] != client:
            raise KeyError(client)
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return ClientData(int(client), self.x[a:b], self.y[a:b])

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[int]:
        return (int(c) for c in self.ids)

    def batch(self, clients: np.ndarray) -> ClientBatch:
        """The clients `clients` as one ClientBatch over this block (no rows copied)."""
        i = self._positions(np.asarray(clients, dtype=np.int64))
        if np.any((i < 0) | (i >= len(self.ids))) or np.any(self.ids[np.clip(i, 0, len(self.ids) - 1)] != clients):
            raise KeyError(f"clients not in this shard: {np.setdiff1d(clients, self.ids)[:5].tolist()}")
        return ClientBatch(np.asarray(clients, dtype=np.int64), self.offsets[i], self.offsets[i + 1] - self.offsets[i],
                           self.x, self.y)


MIN_CHUNK = 256  # clients a thread's share of a batched step must have
CHUNK_SECONDS = 0.015  # CPU seconds of a batched step a thread's share must hold, once a step has been timed
T = TypeVar("T")


class StoredClientRows(Mapping[int, ClientData]):
    """A shard's clients whose rows stay on disk (`data.client_rows`, raysim.data.row_store): each batch reads its
    clients' rows then, so the shard holds the rows of one round's clients, not of all of its own. A shard's range
    of ids is kept as a range, and each client's first row and size as int32 while they fit: 8 bytes a client."""

    def __init__(self, fed: FederatedData, clients: Sequence[int], dtype: torch.dtype, device: str):
        self.path, self.dtype, self.device = fed.train_path, dtype, device
        every = fed.client_sizes  # memory-mapped
        self.ids: range | np.ndarray
        if isinstance(clients, range) and clients.step == 1:
            self.ids = clients
            sizes = np.asarray(every[clients.start:clients.stop])
            first = np.cumsum(sizes, dtype=np.int64) - sizes + int(np.sum(every[:clients.start], dtype=np.int64))
        else:
            self.ids = np.unique(np.asarray(clients, dtype=np.int64))
            sizes, first = np.asarray(every)[self.ids], (np.cumsum(every, dtype=np.int64) - every)[self.ids]
        small = np.int32 if fed.num_train < 2**31 else np.int64  # the file's rows, and each client's first among them
        self.sizes, self.first = sizes.astype(small), first.astype(small)

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[int]:
        return (int(c) for c in self.ids)

    def __getitem__(self, client: int) -> ClientData:
        b = self.batch(np.array([client]))
        return ClientData(int(client), b.x, b.y)

    def _index(self, clients: np.ndarray) -> np.ndarray:
        """The positions of `clients` among this shard's; KeyError naming those it does not hold."""
        c = np.asarray(clients, dtype=np.int64)
        if isinstance(self.ids, range):
            i = c - self.ids.start
            held = (i >= 0) & (i < len(self.ids))
        else:
            i = np.minimum(np.searchsorted(self.ids, c), len(self.ids) - 1)
            held = self.ids[i] == c if len(self.ids) else np.zeros(len(c), dtype=bool)
        if not held.all():
            raise KeyError(f"clients not in this shard: {c[~held][:5].tolist()}")
        return i

    def batch(self, clients: np.ndarray) -> ClientBatch:
        """The clients `clients` as one ClientBatch over their rows, read now."""
        i = self._index(clients)
        sizes = self.sizes[i].astype(np.int64)
        x, y = read_rows_of(self.path, self.first[i], sizes)
        return ClientBatch(np.asarray(clients, dtype=np.int64), np.cumsum(sizes) - sizes, sizes,
                           torch.as_tensor(x, dtype=self.dtype, device=self.device), torch.as_tensor(y, device=self.device))


def client_rows(fed: FederatedData, clients: Sequence[int], dtype: torch.dtype, device: str,
                stored: bool) -> ClientRows | StoredClientRows:
    """The rows of `clients` in `fed`'s training file: read once into memory, or (`stored`) left on disk and read for
    each batch. A client with no rows there (a local test set of none) has an empty block."""
    if stored:
        return StoredClientRows(fed, clients, dtype, device)
    ids = np.arange(clients.start, clients.stop, dtype=np.int64) if isinstance(clients, range) else np.unique(clients)
    sizes = np.asarray(fed.client_sizes)[ids]
    held = ids[sizes > 0]
    read = clients if held.size == ids.size else held
    _, _, x, y = read_client_block(fed.train_path, read) if held.size else _empty_block(fed)
    # as_tensor: the block's own arrays become the tensors (no second copy) where the dtype already fits
    return ClientRows(ids, np.concatenate([[0], np.cumsum(sizes)]), torch.as_tensor(x, dtype=dtype, device=device),
                      torch.as_tensor(y, device=device))


def _empty_block(fed: FederatedData) -> tuple[None, None, np.ndarray, np.ndarray]:
    """No rows, shaped as `fed`'s."""
    y = np.zeros((0, *fed.target_shape), np.float32) if fed.num_classes == 0 else np.zeros(0, np.int64)
    return None, None, np.zeros((0, *fed.feature_shape), np.float32), y


class ClientStates(dict):
    """Client states by id, holding only those a step has set: a client never stepped has its `client_init` state,
    made when asked for (a shard of 10^7 stateless clients holds nothing per client). Pickle `dict(states)`."""

    def __init__(self, init: Callable[[int], Any], saved: Mapping[int, Any] | None = None):
        super().__init__(saved or {})
        self.init = init

    def __missing__(self, client: int) -> Any:
        return self.init(client)


class ClientShard:
    """The clients `clients` of an experiment, in this process. A batched step (`step_batch`) on the CPU runs on
    up to `threads` threads at once, each over a contiguous chunk of the round's clients on one torch thread: a
    client's numbers do not depend on which clients share its call, so the tables are the same for any count. On a
    GPU the batch is one call, and the threads share the host's work (the compute times' quantiles)."""

    def __init__(self, experiment: Experiment, data: dict, clients: Sequence[int], torch_threads: int = 1,
                 cuda_memory_fraction: float | None = None, shard: int = 0, threads: int = 1, device: str = "cpu"):
        """`device`: where the steps run; a client actor's shard given a GPU share (`cuda_memory_fraction` of
        its memory) runs on that GPU."""
        torch.set_num_threads(torch_threads)
        compiled.use_host_threads(threads * torch_threads)  # its CPU share, for an accelerator's batch plans
        self.cfg = experiment.install().cfg
        if cuda_memory_fraction is not None and torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(cuda_memory_fraction)
            device = "cuda"
        if device == "cuda":
            deterministic_cuda(self.cfg.model.tf32)
        clients = clients if isinstance(clients, range) else list(clients)  # a range: no Python int per client
        self.fed = FederatedData.from_dict(data)
        self.algo = experiment.algorithm_for(self.fed, device)
        stored = on_disk(self.cfg.data, self.fed.num_train, self.fed.feature_shape)
        self.data = client_rows(self.fed, clients, DTYPES[self.cfg.model.dtype], device, stored)
        local = self.fed.local_test() if self.cfg.eval.clients != "none" else None
        # federated evaluation's rows: the clients' local test rows (data.local_test_fraction), else their training rows
        self.eval_data = self.data if local is None else client_rows(local, clients, DTYPES[self.cfg.model.dtype],
                                                                     device, stored)
        self.shard, self.clients = shard, clients
        self.blocks = cover(clients, self.fed.num_clients)  # this shard's blocks of the reduction tree
        self.batched = batched(self.algo)
        self.device = device
        self.threads = threads if torch_threads == 1 else 1
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix="shard") if self.threads > 1 else None
        self.step_cpu: float | None = None  # the last batched step's CPU seconds a client (its threads' together)
        self.states = ClientStates(self.algo.client_init)
        self.stateless = type(self.algo).client_init is Algorithm.client_init  # every client's state is None
        self.system = SystemModel(self.cfg.system, self.cfg.seed, self.fed.num_clients)

    def warm_up(self) -> None:
        """Run one client's step the way rounds step it (`step_batch` where the algorithm has one, else `step`), and
        its compute time, and discard both: the process's one-time costs (torch's first kernels, scipy's import for
        the Erlang quantiles) would otherwise make round 1's clients stragglers of the real clock. Not `step` for a
        batched algorithm: local SGD's per-client step takes torch.func's gradient, which imports torch._dynamo
        (1.2-1.7 s), a module its rounds never load."""
        plan = self.algo.plan(self.algo.init(), 0, stream(self.cfg.seed, 0, SERVER, "warm_up")) if self.data else None
        if plan is None or not len(plan.clients) or plan.broadcast is None:  # a round that trains no clients
            return
        c, broadcast = next(iter(self.data)), copy.deepcopy(plan.broadcast)
        ids = np.array([c], dtype=np.int64)
        if self.cfg.algorithm.vectorize and self.batched:  # the rounds' own batched call (it sets no client state)
            costs = self._batch_steps(0, ids, broadcast)[0].costs
        else:
            costs = Costs.of([self.algo.step(self.states[c], self.data[c], broadcast, stream(self.cfg.seed, 0, c, "warm_up"))[2]])
        self.system.client_compute_times(0, ids, costs)

    def save(self, ckpt: str | Path) -> dict[str, dict[str, Any]]:
        """Write this shard's client states into the checkpoint folder `ckpt`; returns the file's sums."""
        return checkpoint.save(checkpoint.dumps(dict(self.states)), checkpoint.shard_path(Path(ckpt), self.shard))

    def snapshot(self) -> bytes:
        """This shard's client states, pickled: the in-memory checkpoint that keeps a restart's replay short."""
        return checkpoint.dumps(dict(self.states))

    def restore(self, ckpt: str | Path | bytes | None, replay: list[tuple[int, Sequence[int] | np.ndarray, Any]]) -> None:
        """Refill client states after a restart or on resume: from checkpoint folder `ckpt`, or this
        shard's `snapshot()` bytes (None: client_init), then re-run the logged rounds since it
        (round, this shard's clients, broadcast) to reach the present."""
        if isinstance(ckpt, bytes):
            saved = pickle.loads(ckpt)
        else:
            saved = checkpoint.client_states(Path(ckpt), self.clients) if ckpt else {}
        self.states = ClientStates(self.algo.client_init, saved)
        for round, clients, broadcast in replay:
            self._steps(round, clients, broadcast)

    def _steps(self, round: int, clients: Sequence[int] | np.ndarray, broadcast: Any, fail: bool = False,
               finish: Callable[[slice, Steps], Any] | None = None
               ) -> tuple[Steps, np.ndarray | CpuSplit, list | None]:
        """The clients' steps for `round` (updating their states) as columns, the CPU seconds of each (this
        process's; a batched step's time as the CpuSplit that splits it in proportion to oracle calls) and, for a
        batched step on the CPU, `finish` of each chunk's slice and steps, run in its thread (else None). `fail` kills
        the process after the first client's step. `clients`: ids as a list or an int64 array (the local backend's
        plan, not converted)."""
        broadcast = copy.deepcopy(broadcast)  # the clients' own writable copy: Ray delivers arrays read-only,
        ids = np.asarray(clients, dtype=np.int64)  # and on the local backend it is the server's own object
        if fail:  # an injected fault (config `faults:`): die mid-round, after some of the work
            first = int(ids[0])
            self.algo.step(self.states[first], self.data[first], broadcast, stream(self.cfg.seed, round, first, "step"))
            os._exit(1)
        finished = None
        cpu: np.ndarray | CpuSplit
        if self.cfg.algorithm.vectorize and self.batched:
            out, cpu, finished = self._batch_steps(round, ids, broadcast, finish)
        else:
            t0 = time.process_time()
            clients = ids.tolist()  # Python ints: the client states' keys and the streams' words
            datas = [self.data[c] for c in clients]
            states = [self.states[c] for c in clients]
            rngs = [stream(self.cfg.seed, round, c, "step") for c in clients]
            if self.cfg.algorithm.vectorize:
                outs = self.algo.step_many(states, datas, broadcast, rngs)
                cpu = CpuSplit(np.array([len(outs)]), np.array([time.process_time() - t0]))
            else:
                outs, times = [], []
                for s, d, r in zip(states, datas, rngs):
                    t1 = time.process_time()
                    outs.append(self.algo.step(s, d, broadcast, r))
                    times.append(time.process_time() - t1)
                cpu = np.array(times)
            out = Steps([o[0] for o in outs], [o[1] for o in outs], Costs.of([o[2] for o in outs]))
        if out.states is not None:
            for c, s in zip(ids.tolist(), out.states):
                self.states[c] = s
        return out, cpu, finished

    @property
    def _chunked(self) -> bool:
        """Whether a round's steps run in chunks on the host threads, each finishing its own clients (compute times,
        tree blocks) in its thread: a CPU shard's batched step."""
        return self.device == "cpu" and self.cfg.algorithm.vectorize and self.batched

    def _cut(self, k: int) -> int:
        """The chunks k clients make at MIN_CHUNK clients each, up to the shard's threads."""
        return min(self.threads, k // MIN_CHUNK)

    def _map(self, fn: Callable[[slice], T], k: int, chunks: int | None = None) -> list[T]:
        """fn of consecutive slices of k clients: on the shard's threads, a chunk each, `chunks` of them (default:
        `_cut(k)`)."""
        n = self._cut(k) if chunks is None else min(self.threads, chunks)
        if n <= 1 or self.pool is None:
            return [fn(slice(0, k))]
        bounds = np.linspace(0, k, n + 1).astype(int)
        return list(self.pool.map(fn, [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]))

    def _batch_steps(self, round: int, ids: np.ndarray, broadcast: Any, finish: Callable[[slice, Steps], Any] | None = None
                     ) -> tuple[Steps, CpuSplit, list | None]:
        """`step_batch` of the clients `ids`, in chunks on the shard's threads, their CPU seconds (each chunk's time,
        split in proportion to oracle calls) and, on the CPU, `finish(slice, steps)` of each chunk in
        its thread (None otherwise, or without `finish`). A chunk whose `finish` gives (..., parts) with parts has
        used its replies: the joined Steps then carry none."""
        split = self._chunked  # a GPU takes the whole batch at once
        clock = time.thread_time if self.pool is not None and split else time.process_time  # a chunk's CPU is its thread's
        finish = finish if split else None

        def run(s: slice) -> tuple[Steps, float, Any]:
            t0, part = clock(), ids[s]
            states = None if self.stateless else [self.states[c] for c in part.tolist()]
            out = self.algo.step_batch(states, self.data.batch(part), broadcast, Keys(self.cfg.seed, round, part, "step"))
            return out, clock() - t0, None if finish is None else finish(s, out)

        cut = self._cut(len(ids)) if split else 1
        done = self._map(run, len(ids), step_chunks(cut, None if self.step_cpu is None else self.step_cpu * len(ids)))
        if cut > 1:  # a step that could be cut: its CPU time a client chooses how the next is
            self.step_cpu = float(sum(t for _, t, _ in done)) / len(ids)
        outs = [o for o, _, _ in done]
        cpu = CpuSplit(np.cumsum([len(o.costs) for o in outs]), np.array([t for _, t, _ in done]))
        finished = None if finish is None else [f for _, _, f in done]
        used = finished is not None and all(f[1] is not None for f in finished)  # the replies went into the parts
        if len(done) == 1:
            return Steps(None if used else outs[0].replies, outs[0].states, outs[0].costs), cpu, finished
        states = None if any(o.states is None for o in outs) else [s for o in outs for s in o.states or []]
        replies = None if used else concat_rows([o.replies for o in outs])
        return Steps(replies, states, Costs.concat([o.costs for o in outs])), cpu, finished

    def evaluate(self, clients: np.ndarray, payload: Any) -> dict[str, np.ndarray]:
        """Federated evaluation of `clients` (sorted ids) with the server's `payload` (the algorithm's
        `evaluate_clients`), in chunks on the shard's threads: columns client_id, samples and the metrics."""
        ids = np.asarray(clients, dtype=np.int64)

        def run(s: slice) -> dict[str, np.ndarray]:
            part = ids[s]
            states = None if self.stateless else [self.states[c] for c in part.tolist()]
            batch = self.eval_data.batch(part)
            return {"samples": batch.sizes, **self.algo.evaluate_clients(payload, states, batch)}

        done = self._map(run, len(ids), None if self.device == "cpu" else 1)
        return {"client_id": ids, **{n: np.concatenate([d[n] for d in done]) for n in done[0]}}

    def train(self, round: int, clients: Sequence[int] | np.ndarray, broadcast: Any, reduce: bool,
              fail: bool = False) -> ShardResult:
        """Run `clients`' step for `round` and sample their compute times (a CPU shard in its chunks; a shard of one
        call only where they decide who is aggregated, `times_drop`, else the server does); with `reduce`, send this
        shard's blocks of the reduction tree over the clients within the deadline instead of replies."""
        ids = np.asarray(clients, dtype=np.int64)
        u = self.system.compute_uniforms(round, ids) if self._chunked else None  # one draw, not one a chunk

        def times_of(s: slice, costs: Costs) -> np.ndarray:
            return self.system.client_compute_times(round, ids[s], costs, None if u is None else u[s])

        in_order = bool(np.all(ids[1:] >= ids[:-1]))

        def finish(s: slice, steps: Steps) -> tuple[np.ndarray, list[Part] | None]:
            """In a chunk's thread: its clients' compute times and, with `reduce`, its blocks of the tree (the shard's
            blocks cut at the chunk's first id and the next chunk's: a finer cover of the same tree, the same bits)."""
            times = times_of(s, steps.costs)
            if not (reduce and in_order) or isinstance(steps.replies, list):
                return times, None
            kept = self.system.within_deadline(times)
            lo = int(ids[s.start]) if s.start else 0
            hi = int(ids[s.stop]) if s.stop < len(ids) else self.fed.num_clients
            whole = s.stop - s.start == len(ids)  # one chunk, on this thread: the pool may share a wide field's columns
            return times, reduce_stacked(ids[s][kept], steps.replies if kept.all() else take_rows(steps.replies, kept),
                                         self._blocks_within(lo, hi), self.pool if whole else None, self.threads)

        out, cpu, finished = self._steps(round, ids, broadcast, fail, finish)
        times: np.ndarray | None = None
        if finished is not None:
            times = np.concatenate([t for t, _ in finished])
        elif self.system.times_drop():  # one call (a GPU shard, a per-client algorithm), needed here to drop clients
            times = times_of(slice(0, len(ids)), out.costs) if len(ids) else np.zeros(0)
        # else the server samples them (the same keyed draws; on Ray once the next round is sent): a GPU shard's host
        # thread sets its pace, and on it 10^4 clients' quantiles took 2 ms a round
        stacked = not isinstance(out.replies, list)
        parts: list[Part] = []
        replies: list = []
        if reduce and out.replies is None and finished is not None:  # the chunks reduced their own replies
            parts = merge_parts([p for _, chunk in finished for p in chunk or []], self.blocks, self._combine)
        elif reduce:
            kept = self.system.within_deadline(times) if times is not None else np.ones(len(ids), dtype=bool)
            if stacked:
                parts = reduce_stacked(ids[kept], out.replies if kept.all() else take_rows(out.replies, kept), self.blocks,
                                       self.pool, self.threads)
            else:
                parts = reduce_owned({c: r for c, r, k in zip(ids.tolist(), out.replies, kept) if k}, self.blocks,
                                     self._combine)
        else:
            replies = unstack(out.replies, len(ids)) if stacked else out.replies
        return ShardResult(ids, out.costs, times, replies, cpu, parts)

    def _combine(self, a: Any, b: Any) -> Any:
        """Two nodes of the reduction tree combined, as the server combines them (the algorithm's `reduce`)."""
        return self.algo.reduce([a, b])

    def _blocks_within(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """This shard's blocks of the reduction tree cut to the ids lo..hi-1: the largest aligned blocks in both."""
        return [b for s, z in self.blocks if max(s, lo) < min(s + z, hi)
                for b in cover(range(max(s, lo), min(s + z, hi)), self.fed.num_clients)]


def step_chunks(cut: int, cpu: float | None) -> int:
    """The chunks of a batched step on a shard's threads: `cut` (MIN_CHUNK clients each, up to the threads) until a
    step has been timed, then as many of those as hold CHUNK_SECONDS each of its estimated CPU seconds `cpu` (at
    least one). The threads contend for the interpreter at every call, so a light chunk on a thread of its own is
    slower than none: on two cores a 1,000-client step of logistic regression (13 ms of CPU) ran a quarter faster
    whole than cut in two, and an MLP's (170 ms) 1.6 times slower. The bits do not depend on the chunks."""
    return cut if cpu is None else max(1, min(cut, int(cpu / CHUNK_SECONDS)))


def _shares(calls: np.ndarray, seconds: float) -> np.ndarray:
    """`seconds` split over clients in proportion to their oracle calls (evenly when none made any)."""
    calls = np.asarray(calls, dtype=np.float64)
    return calls * (seconds / calls.sum()) if calls.sum() > 0 else np.full(len(calls), seconds / max(len(calls), 1))
