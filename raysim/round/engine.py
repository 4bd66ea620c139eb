"""One synchronized round without Ray: plan -> client steps (by the backend) -> aggregate -> system
model -> ledger -> the round's rows. The Ray server actor and the local backend both drive it."""
from __future__ import annotations

import copy
import time
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.contract import Cost, EvalData, Plan
from raysim.core.rng import SERVER, SETUP, stream
from raysim.data import FederatedData, read_rows, read_table_arrays
from raysim.models import DTYPES
from raysim.round.experiment import Experiment
from raysim.round.reduction import root_size, tree_reduce
from raysim.round.shard import ShardResult
from raysim.storage import checkpoint
from raysim.system import Ledger, RoundTiming, SystemModel, payload_bytes


def eval_data(fed: FederatedData, dtype: torch.dtype, train_samples: int, seed: int) -> EvalData:
    """The test set and a seeded sample of at most `train_samples` pooled training samples."""
    tx, ty = read_table_arrays(fed.test_path)
    keep = np.arange(fed.num_train) if fed.num_train <= train_samples else \
        np.sort(stream(seed, SETUP, SERVER, "eval_train").choice(fed.num_train, train_samples, replace=False))
    x, y = read_rows(fed.train_path, keep)
    return EvalData(torch.tensor(tx, dtype=dtype), torch.tensor(ty), torch.tensor(x, dtype=dtype), torch.tensor(y))


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

    @property
    def client_list(self) -> list[int]:
        return self.clients.tolist()


@dataclass
class RoundOutcome:
    """A round after aggregation: who arrived, what they cost, who was dropped and the sampled timing."""

    arrived: list[int]
    costs: list
    cpu: list[float]
    timing: RoundTiming
    totals: dict
    late: list[int]
    server_cost: Cost


class RoundEngine:
    """The server's side of an experiment: its state, the system model and the ledger."""

    def __init__(self, experiment: Experiment, fed: FederatedData):
        self.cfg = experiment.cfg
        self.fed = fed
        self.algo = experiment.algorithm_for(fed, "cpu")
        self.state = self.algo.init()
        self.system = SystemModel(self.cfg.system, self.cfg.seed, fed.num_clients)
        self.ledger = Ledger()
        self.eval = eval_data(fed, DTYPES[self.cfg.model.dtype], self.cfg.eval.train_samples, self.cfg.seed)

    def plan(self, round: int) -> RoundPlan:
        """The algorithm's plan for `round`; shards pre-reduce when nothing is chosen by arrival."""
        t0 = time.perf_counter()
        plan = self.algo.plan(self.state, round, stream(self.cfg.seed, round, SERVER, "plan"))
        keep = self.cfg.algorithm.clients_per_round if self.cfg.system.stragglers.over_select > 0 else None
        reduce = self.algo.reducible and keep is None and self.cfg.system.clock.mode == "virtual"
        clients = np.asarray(plan.clients, dtype=np.int64)
        return RoundPlan(round, plan, clients, keep, reduce, t0, payload_bytes(plan.broadcast) if clients.size else 0)

    def aggregate(self, rp: RoundPlan, results: list[ShardResult], late: Set[int] = frozenset()) -> RoundOutcome:
        """Drop stragglers (unless the real clock already did), aggregate the kept replies in client
        order (or the completed reduction tree), then sample the round's timing and book it."""
        by_client = {c: (r, i) for r in results for i, c in enumerate(r.clients)}
        arrived = [c for c in rp.client_list if c in by_client]
        pick = [by_client[c] for c in arrived]
        costs = [r.costs[i] for r, i in pick]
        times = np.array([r.compute_times[i] for r, i in pick])
        cpu = [r.cpu_seconds[i] for r, i in pick]
        ids = np.asarray(arrived, dtype=np.int64)
        if self.cfg.system.clock.mode == "real":  # what arrived in real time is kept; the rest is `late`
            dropped = np.zeros(len(arrived), dtype=bool)
        else:
            dropped, _ = self.system.stragglers(ids, times, rp.keep)
        # the server's own writable copies: Ray delivers a shard's arrays read-only
        if rp.reduce:
            total = tree_reduce(copy.deepcopy([p for r in results for p in r.parts]), 0, root_size(self.fed.num_clients),
                                lambda a, b: self.algo.reduce([a, b]))
            replies = [] if total is None else [total]
        else:
            replies = copy.deepcopy([r.replies[i] for (r, i), d in zip(pick, dropped) if not d])
        rng = stream(self.cfg.seed, rp.round, SERVER, "aggregate")
        self.state, server_cost = self.algo.aggregate(self.state, replies, rng)
        server_time = self.system.server_compute_time(rp.round, server_cost)
        timing = self.system.close_round(rp.round, ids, times, costs, server_cost, server_time, dropped, rp.keep)
        totals = self.ledger.add(timing, costs, server_cost, rp.broadcast_bytes * len(rp.clients))
        return RoundOutcome(arrived, costs, cpu, timing, totals, sorted(late), server_cost)

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

    def rows(self, rp: RoundPlan, out: RoundOutcome, restarts: int = 0, saved: bool = False) -> tuple[dict, list[dict]]:
        """Evaluate (every `eval.every` rounds and the last) and return the round's results row and
        per-client rows."""
        round, timing = rp.round, out.timing
        metrics = self.algo.evaluate(self.state, self.eval) if self.cfg.evaluates(round) else {}
        dropped = int(timing.dropped.sum())
        row = {
            "round": round,
            "phase": rp.plan.phase,
            "clients": len(out.arrived) - dropped,
            "selected": len(rp.clients),
            "dropped": dropped + len(out.late),
            **out.totals,
            "server_oracle_calls": out.server_cost.oracle_calls,
            "server_oracle_batches": out.server_cost.oracle_batches,
            "round_sim_time": timing.round_time,
            "round_wall_s": time.perf_counter() - rp.started,
            "client_cpu_s": float(sum(out.cpu)),
            "actor_restarts": restarts,
            "checkpoint": saved,
            **metrics,
        }
        client_rows = [
            {"round": round, "client_id": c, "oracle_calls": cost.oracle_calls, "oracle_batches": cost.oracle_batches,
             "upload_vectors": cost.upload_vectors,
             "upload_bytes": 0 if d else cost.upload_bytes, "download_bytes": rp.broadcast_bytes,
             "compute_time": float(timing.compute_time[i]),
             "upload_time": float(timing.upload_time[i]), "finish_time": float(timing.finish_time[i]),
             "dropped": bool(d), "cpu_s": out.cpu[i]}
            for i, (c, cost, d) in enumerate(zip(out.arrived, out.costs, timing.dropped))
        ] + [{"round": round, "client_id": c, "oracle_calls": 0, "oracle_batches": 0, "upload_vectors": 0.0, "upload_bytes": 0,
              "download_bytes": rp.broadcast_bytes, "compute_time": np.nan,
              "upload_time": 0.0, "finish_time": np.nan, "dropped": True, "cpu_s": np.nan} for c in out.late]
        return row, client_rows


def shards_of(clients: list[int], per_shard: int) -> dict[int, list[int]]:
    """The round's clients grouped by the shard that hosts them (shard i hosts ids i*per_shard..)."""
    by_shard: dict[int, list[int]] = {}
    for c in clients:
        by_shard.setdefault(c // per_shard, []).append(c)
    return by_shard
