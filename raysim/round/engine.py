"""One synchronized round without Ray: plan -> client steps (by the backend) -> aggregate -> system
model -> ledger -> the round's rows. The Ray server actor and the local backend both drive it."""
from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.contract import Cost, Costs, EvalData, Plan
from raysim.core.device import deterministic_cuda
from raysim.core.rng import SERVER, SETUP, stream
from raysim.core.sampling import sample_clients
from raysim.core.summary import SUMMARY_QUANTILES, summary_names
from raysim.data import FederatedData, read_rows, read_table_arrays
from raysim.data.row_store import read_rows_of, row_paths
from raysim.models import DTYPES
from raysim.round.experiment import Experiment
from raysim.round.reduction import root_size, tree_reduce
from raysim.round.shard import ShardResult
from raysim.storage import checkpoint
from raysim.system import Ledger, RoundTiming, SystemModel, payload_bytes
from raysim.system.model import ClientPhases


def eval_data(fed: FederatedData, dtype: torch.dtype, train_samples: int, seed: int,
              test_samples: int | None = None) -> EvalData:
    """The test set (or a seeded sample of at most `test_samples` of it) and a seeded sample of at most
    `train_samples` pooled training samples; the arrays read become the tensors, with no second copy."""
    if test_samples is None or fed.num_test <= test_samples:
        tx, ty = read_table_arrays(fed.test_path)
    else:
        tx, ty = _sample(fed.test_path, np.sort(stream(seed, SETUP, SERVER, "eval_test").choice(
            fed.num_test, test_samples, replace=False)))
    keep = np.arange(fed.num_train) if fed.num_train <= train_samples else \
        np.sort(stream(seed, SETUP, SERVER, "eval_train").choice(fed.num_train, train_samples, replace=False))
    x, y = _sample(fed.train_path, keep)
    return EvalData(torch.as_tensor(tx, dtype=dtype), torch.as_tensor(ty), torch.as_tensor(x, dtype=dtype), torch.as_tensor(y))


def _sample(path: Path, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows` (sorted) of a table file: from its flat files where the build wrote them (a few pages each),
    else a row group at a time from the Parquet file."""
    if all(p.exists() for p in row_paths(path)):
        return read_rows_of(path, rows, np.ones(len(rows), dtype=np.int64))
    return read_rows(path, rows)


@dataclass
class RoundPlan:
    """A round as planned: its clients, what they receive (and its size), how many are kept
    (over-selection), and whether shards pre-reduce their replies."""

    round: int
    plan: Plan
    clients: np.ndarray
    keep: int | None
    reduce: bool
    started: float
    broadcast_bytes: int
    sim_start: float = 0.0  # when the round can start in simulated time (read only under system.availability)
    available: int | None = None  # clients online at its start (system.availability), when some may not be


@dataclass
class Updated:
    """A round whose replies are aggregated into the server's state, its timing not yet sampled: who arrived, what
    they cost, their compute times (None: sampled by `settle`) and CPU seconds, who was dropped, the clients' phases
    (availability) and the server's cost."""

    rp: RoundPlan
    ids: np.ndarray
    costs: Costs
    times: np.ndarray | None
    cpu: np.ndarray
    dropped: np.ndarray
    phases: ClientPhases | None
    server_cost: Cost
    late: Set[int]


@dataclass
class RoundOutcome:
    """A round after aggregation: who arrived, what they cost, who was dropped and the sampled timing."""

    arrived: np.ndarray
    costs: Costs
    cpu: np.ndarray
    timing: RoundTiming
    totals: dict
    late: list[int]
    server_cost: Cost


class RoundEngine:
    """The server's side of an experiment: its state, the system model and the ledger."""

    def __init__(self, experiment: Experiment, fed: FederatedData, device: str = "cpu"):
        """`device`: where the server's algorithm runs (its evaluation above all)."""
        self.cfg = experiment.cfg
        self.fed = fed
        if device == "cuda":
            deterministic_cuda(self.cfg.model.tf32)
        self.algo = experiment.algorithm_for(fed, device)
        self.state = self.algo.init()
        self.system = SystemModel(self.cfg.system, self.cfg.seed, fed.num_clients)
        self.ledger = Ledger()
        self.eval = eval_data(fed, DTYPES[self.cfg.model.dtype], self.cfg.eval.train_samples, self.cfg.seed,
                              self.cfg.eval.test_samples)

    def plan(self, round: int) -> RoundPlan:
        """The algorithm's plan for `round`; shards pre-reduce when nothing is chosen by arrival."""
        t0 = time.perf_counter()
        plan = self.algo.plan(self.state, round, stream(self.cfg.seed, round, SERVER, "plan"))
        keep = self.cfg.algorithm.clients_per_round if self.cfg.system.stragglers.over_select > 0 else None
        avail = self.system.availability
        reduce = self.algo.reducible and keep is None and self.cfg.system.clock.mode == "virtual" and not avail.drops
        online, start = None, self.ledger.sim_time
        if avail.restricts:  # the plan's uniform draw, over the clients online when the round starts
            online, start = self._online(round)
            chosen = sample_clients(online.size, len(plan.clients), stream(self.cfg.seed, round, SERVER, "plan"))
            plan = dataclasses.replace(plan, clients=online[chosen])
        clients = np.asarray(plan.clients, dtype=np.int64)
        return RoundPlan(round, plan, clients, keep, reduce, t0, payload_bytes(plan.broadcast) if clients.size else 0,
                         start, None if online is None else online.size)

    def _online(self, round: int) -> tuple[np.ndarray, float]:
        """The clients online when `round` can start, and when that is: now, or, with nobody online, when the first
        client comes online (each try a fresh Bernoulli draw)."""
        avail, t = self.system.availability, self.ledger.sim_time
        online = np.flatnonzero(avail.available(t, round, "select"))
        tries = 0
        while not online.size:
            tries += 1
            t = avail.next_online(t)
            if t == np.inf:
                raise RuntimeError(f"system.availability: no client is online at simulated time {self.ledger.sim_time:g}"
                                   " or later")
            online = np.flatnonzero(avail.available(t, round, f"select{tries}"))
        return online, t

    def aggregate(self, rp: RoundPlan, results: list[ShardResult], late: Set[int] = frozenset()) -> RoundOutcome:
        """Drop stragglers (unless the real clock already did), aggregate the kept replies in client
        order (or the completed reduction tree), then sample the round's timing and book it."""
        return self.settle(self.update(rp, results, late))

    def update(self, rp: RoundPlan, results: list[ShardResult], late: Set[int] = frozenset()) -> Updated:
        """`aggregate`'s first half: the server's new state from the kept replies. The next round can be planned and
        sent from it (`timing_free`) while `settle` samples this one's timing."""
        clients = np.concatenate([r.clients for r in results]) if results else np.zeros(0, dtype=np.int64)
        order = np.argsort(clients, kind="stable")
        at = np.searchsorted(clients[order], rp.clients)
        found = at < clients.size
        found[found] = clients[order[at[found]]] == rp.clients[found]
        pick = order[at[found]]  # the replies' positions, in the plan's client order
        ids = rp.clients[found].astype(np.int64)
        costs = Costs.concat([r.costs for r in results]).take(pick)
        times = None  # a shard leaves them to `settle` where they drop no client (`times_drop`)
        if all(r.compute_times is not None for r in results):
            times = np.concatenate([r.compute_times for r in results])[pick] if results else np.zeros(0)
        cpu = np.concatenate([r.cpu_seconds for r in results])[pick] if results else np.zeros(0)
        if self.cfg.system.clock.mode == "real" or times is None:  # real clock: what arrived in time is kept
            dropped = np.zeros(len(ids), dtype=bool)
        else:
            dropped, _ = self.system.stragglers(ids, times, rp.keep)
        phases = None
        if self.system.availability.drops:  # who goes offline before delivering is dropped before the aggregation
            assert times is not None, "offline drops are timed by the shards (times_drop)"
            gone = self.system.availability.offline_at(ids, rp.sim_start) - rp.sim_start
            phases = self.system.client_phases(rp.round, times, costs, dropped, rp.keep, gone)
            dropped = phases.dropped
        # the server's own writable copies: Ray delivers a shard's arrays read-only
        if rp.reduce:
            total = tree_reduce(copy.deepcopy([p for r in results for p in r.parts]), 0, root_size(self.fed.num_clients),
                                lambda a, b: self.algo.reduce([a, b]))
            replies = [] if total is None else [total]
        else:
            every = [reply for r in results for reply in r.replies]
            replies = copy.deepcopy([every[i] for i, d in zip(pick, dropped) if not d])
        rng = stream(self.cfg.seed, rp.round, SERVER, "aggregate")
        self.state, server_cost = self.algo.aggregate(self.state, replies, rng)
        return Updated(rp, ids, costs, times, cpu, dropped, phases, server_cost, late)

    def settle(self, up: Updated) -> RoundOutcome:
        """`aggregate`'s second half: the round's simulated timing (the server's compute, the upload queue, the
        phases), booked in the ledger."""
        rp = up.rp
        times = up.times if up.times is not None else self.system.client_compute_times(rp.round, up.ids, up.costs)
        server_time = self.system.server_compute_time(rp.round, up.server_cost)
        timing = self.system.close_round(rp.round, up.ids, times, up.costs, up.server_cost, server_time, up.dropped,
                                         rp.keep, up.phases)
        if rp.sim_start > self.ledger.sim_time:  # the round waited for a client to come online
            timing = dataclasses.replace(timing, round_time=timing.round_time + rp.sim_start - self.ledger.sim_time)
        totals = self.ledger.add(timing, up.costs, up.server_cost, rp.broadcast_bytes * len(rp.clients))
        return RoundOutcome(up.ids, up.costs, up.cpu, timing, totals, sorted(up.late), up.server_cost)

    def timing_free(self) -> bool:
        """Whether a round's plan is the same before and after the last round's timing is booked: the ledger's
        simulated time chooses no clients (no `system.availability`), so the next round may be sent before `settle`."""
        return not self.system.availability.restricts

    def checkpoint_due(self, round: int) -> bool:
        """Whether the run checkpoints after `round` (every `checkpoint.every` rounds and the last)."""
        every = self.cfg.checkpoint.every
        return every > 0 and (round % every == 0 or round == self.cfg.algorithm.rounds)

    def save(self, folder: Path) -> dict[str, dict[str, Any]]:
        """Write the server's state and ledger into checkpoint `folder`; returns the file's sums."""
        return checkpoint.save(checkpoint.dumps((self.state, self.ledger)), folder / "server.pkl")

    def load(self, folder: Path) -> None:
        """Take the server's state and ledger from checkpoint `folder`."""
        self.state, self.ledger = checkpoint.load(folder / "server.pkl")

    def eval_clients(self, round: int, selected: np.ndarray) -> np.ndarray | None:
        """The clients evaluated on their own data after `round` (`eval.clients`, at evaluated rounds; `selected`: the
        round's clients, or a server update's applied ones), in id order; None when none are."""
        which = self.cfg.eval.clients
        if which == "none" or not self.cfg.evaluates(round):
            return None
        if which == "selected":
            return np.unique(selected)
        if which == "all":
            return np.arange(self.fed.num_clients, dtype=np.int64)
        rng = stream(self.cfg.seed, round, SERVER, "eval_clients")
        return np.sort(rng.choice(self.fed.num_clients, which.sample, replace=False)).astype(np.int64)

    def eval_payload(self) -> Any:
        """What the clients' actors evaluate: the algorithm's `eval_payload` of the current server state."""
        return self.algo.eval_payload(self.state)

    def metrics(self, round: int, evals: dict[str, np.ndarray] | None) -> tuple[dict, dict[str, np.ndarray] | None]:
        """The metrics of the state after `round` (evaluated every `eval.every` rounds and the last) and the federated
        evaluation's rows (`evals`, the shards' columns, with the round and the split added; their distribution
        summarized in the metrics)."""
        metrics = self.algo.round_metrics(self.state, round)
        metrics.update(self.algo.evaluate(self.state, self.eval) if self.cfg.evaluates(round) else {})
        if evals is None:
            return metrics, None
        metrics.update(client_metric_summary(evals))
        n = len(evals["client_id"])
        split = "train" if self.fed.local_test_path is None else "local_test"
        return metrics, {"round": np.full(n, round, dtype=np.int64), **evals, "split": np.full(n, split)}

    def rows(self, rp: RoundPlan, out: RoundOutcome, restarts: int = 0, saved: bool = False,
             evals: dict[str, np.ndarray] | None = None) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        """Evaluate (every `eval.every` rounds and the last) and return the round's results row, its clients' rows
        as columns, and the federated evaluation's rows (`evals`, the shards' columns, with the round and the split
        added; their distribution summarized in the row)."""
        round, timing = rp.round, out.timing
        metrics, eval_rows = self.metrics(round, evals)
        dropped = int(timing.dropped.sum())
        row = {
            "round": round,
            "phase": rp.plan.phase,
            "clients": len(out.arrived) - dropped,
            "selected": len(rp.clients),
            "dropped": dropped + len(out.late),
            **({} if rp.available is None else {"available": rp.available}),
            **({} if timing.offline is None else {"offline": int(timing.offline.sum())}),
            **out.totals,
            "server_oracle_calls": out.server_cost.oracle_calls,
            "server_oracle_batches": out.server_cost.oracle_batches,
            "round_sim_time": timing.round_time,
            "round_wall_s": time.perf_counter() - rp.started,
            "client_cpu_s": float(np.sum(out.cpu)),
            "actor_restarts": restarts,
            "checkpoint": saved,
            **metrics,
        }
        n, late = len(out.arrived), np.asarray(out.late, dtype=np.int64)
        kept = ~timing.dropped
        client_rows = {
            "round": np.full(n + late.size, round, dtype=np.int64),
            "client_id": np.concatenate([out.arrived, late]),
            "oracle_calls": np.concatenate([out.costs.oracle_calls, np.zeros(late.size, dtype=np.int64)]),
            "oracle_batches": np.concatenate([out.costs.oracle_batches, np.zeros(late.size, dtype=np.int64)]),
            "upload_vectors": np.concatenate([out.costs.upload_vectors, np.zeros(late.size)]),
            "upload_bytes": np.concatenate([np.where(kept, out.costs.upload_bytes, 0), np.zeros(late.size, dtype=np.int64)]),
            "download_bytes": np.full(n + late.size, rp.broadcast_bytes, dtype=np.int64),
            "compute_time": np.concatenate([timing.compute_time.astype(np.float64), np.full(late.size, np.nan)]),
            "upload_time": np.concatenate([timing.upload_time.astype(np.float64), np.zeros(late.size)]),
            "finish_time": np.concatenate([timing.finish_time.astype(np.float64), np.full(late.size, np.nan)]),
            "dropped": np.concatenate([timing.dropped.astype(bool), np.ones(late.size, dtype=bool)]),
            "cpu_s": np.concatenate([np.asarray(out.cpu, dtype=np.float64), np.full(late.size, np.nan)]),
        }
        if timing.offline is not None:
            client_rows["offline"] = np.concatenate([timing.offline, np.zeros(late.size, dtype=bool)])
        return row, client_rows, eval_rows


def client_metric_summary(evals: dict[str, np.ndarray]) -> dict[str, float]:
    """The distribution of each per-client metric over the evaluated clients: the sample-weighted mean, the std and
    the 10th, 50th and 90th percentiles over clients (`client_<metric>_mean`, `_std`, `_p10`, ...)."""
    out: dict[str, float] = {}
    w = np.asarray(evals["samples"], dtype=np.float64)
    for name, v in evals.items():
        if name in ("client_id", "samples"):
            continue
        v = np.asarray(v, dtype=np.float64)
        ok = ~np.isnan(v)
        if not ok.any() or w[ok].sum() == 0:
            continue
        values = [float(np.sum(w[ok] * v[ok]) / np.sum(w[ok])), float(np.std(v[ok])),
                  *(float(np.percentile(v[ok], q)) for q in SUMMARY_QUANTILES)]
        out.update(zip(summary_names(name), values))
    return out


def shards_of(clients: list[int] | np.ndarray, per_shard: int) -> dict[int, np.ndarray]:
    """The round's clients grouped by the shard that hosts them (shard i hosts ids i*per_shard..), each shard's in
    the round's order, as int64 arrays (a call's argument pickles as one buffer, not a Python int per client)."""
    ids = np.asarray(clients, dtype=np.int64)
    shard = ids // per_shard
    order = np.argsort(shard, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(shard[order]) != 0]) if ids.size else np.zeros(0, dtype=np.int64)
    groups = np.split(ids[order], starts[1:])
    return {int(shard[order[s]]): g for s, g in zip(starts, groups)}
