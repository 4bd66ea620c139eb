"""Server updates under the buffered (FedBuff, Nguyen et al., 2022), async (FedAsync, Xie et al., 2019) and
semi_sync (rounds of a fixed simulated period, late updates applied later) schedules, without Ray.

The event-driven clock (raysim.schedule.timeline) times each client task when it starts, from the Costs its step
will have (`plan_costs`); the tasks that start from one server version train together, on the backend's shards,
when the first of them is needed; at each update the arrivals' replies, weighed by their staleness (`stale`), are
summed along the fixed tree over client ids and aggregated.

Every draw is keyed by (seed, version + 1, client, purpose), the key of the synchronous round that would train
from that version, so with equal compute times and C = K = clients a round the buffered schedule trains and
aggregates exactly as synchronous rounds do.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysim.contract import Cost
from raysim.core.keys import Keys
from raysim.core.rng import SERVER, stream
from raysim.core.sampling import sample_clients
from raysim.round.engine import RoundEngine
from raysim.round.reduction import root_size, tree_reduce
from raysim.round.shard import ShardResult
from raysim.schedule import staleness_weight
from raysim.schedule.timeline import Task, Timeline
from raysim.storage import checkpoint
from raysim.system import payload_bytes

Trainer = Callable[[int, list[int], Any], list[ShardResult]]  # (round key, clients in id order, broadcast) -> results


@dataclass
class UpdateOutcome:
    """One server update: the arrivals applied and those dropped (too stale, or offline) since the last update, the
    tasks started since, the server's Cost, the ledger's totals, its simulated duration and when it began (wall)."""

    round: int
    applied: list[Task]
    dropped: list[Task]
    started: int
    server_cost: Cost
    totals: dict
    sim_time: float
    started_wall: float


class ScheduledEngine:
    """The buffered, async and semi_sync schedules over a RoundEngine's algorithm, state, system model and ledger."""

    def __init__(self, engine: RoundEngine):
        self.engine = engine
        cfg = engine.cfg
        self.schedule = cfg.schedule.resolved(cfg.algorithm.clients_per_round)
        assert self.schedule.concurrency is not None and self.schedule.buffer is not None  # resolved
        self.timeline = Timeline(self.schedule.concurrency, self.schedule.buffer, self.schedule.max_staleness)
        self.states: dict[int, Any] = {0: engine.state}  # the server state of every version a task still needs
        self.broadcasts: dict[int, Any] = {}
        self.untrained: dict[int, dict[int, Task]] = {}  # version -> seq -> task started from it, not trained
        self.replies: dict[int, Any] = {}  # seq -> reply, trained and not yet arrived
        self.cpu: dict[int, float] = {}  # seq -> CPU seconds of its step
        self.started = 0  # tasks started since the last update

    @property
    def cfg(self) -> Any:
        return self.engine.cfg

    def _broadcast(self, version: int) -> Any:
        """What a client starting from `version` receives: the broadcast of the synchronous round version + 1."""
        if version not in self.broadcasts:
            rng = stream(self.cfg.seed, version + 1, SERVER, "plan")
            plan = self.engine.algo.plan(self.states[version], version + 1, rng)
            self.broadcasts[version] = plan.broadcast
        return self.broadcasts[version]

    def _start(self, limit: int) -> None:
        """Start up to `limit` clients now, drawn uniformly from the eligible online ones (the first draw of a version
        is the synchronous round's plan draw), timed by their planned Costs."""
        tl, e = self.timeline, self.engine
        v, seed, avail = tl.version, self.cfg.seed, e.system.availability
        pool = tl.eligible(e.fed.num_clients)
        if not pool.size:
            return
        draw = tl.starts
        if avail.restricts:
            tl.starts += 1
            pool = pool[avail.available(tl.now, v + 1, f"select{draw}")[pool]]
        n = min(limit, len(pool))
        if n == 0:
            return
        tl.starts = draw + 1
        rng = stream(seed, v + 1, SERVER, "plan" if draw == 0 else f"start{draw}")
        clients = pool[sample_clients(len(pool), n, rng)]
        costs = e.algo.plan_costs(clients, Keys(seed, v + 1, clients, "step"))
        times = e.system.client_compute_times(v + 1, clients, costs)
        tasks = tl.start(clients, times, self._services(v + 1, clients, costs.upload_vectors),
                         [costs.cost(i) for i in range(len(clients))], avail.offline_at(clients, tl.now))
        nbytes = payload_bytes(self._broadcast(v))
        for t in tasks:
            t.download = nbytes
        self.untrained.setdefault(v, {}).update((t.seq, t) for t in tasks)
        self.started += len(tasks)

    def _services(self, round: int, clients: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """The uploads' service times at the carried queue: phi*Gamma(size, 1) (burke) or phi*Gamma(size, 1/nu)
        (explicit), keyed by (seed, round, client, "upload")."""
        comm = self.cfg.system.comm
        scale = 1.0 if comm.mode == "burke" else 1.0 / comm.nu
        return np.array([comm.phi * stream(self.cfg.seed, round, c, "upload").gamma(s, scale) if s > 0 and comm.phi else 0.0
                         for c, s in zip(clients.tolist(), vectors.tolist())])

    def _train(self, version: int, train: Trainer) -> None:
        """Train every task started from `version` that is not trained yet, as one batch, and check that their
        Costs and compute times are the ones they were timed by."""
        tasks = self.untrained.pop(version, {})
        if not tasks:
            return
        by_client = {t.client: t for t in tasks.values()}
        results = train(version + 1, sorted(by_client), self._broadcast(version))
        for r in results:
            cpu = r.cpu_seconds
            for i, c in enumerate(r.clients.tolist()):
                task = by_client[c]
                cost = r.costs.cost(i)
                if (cost.oracle_calls, cost.oracle_batches, cost.upload_bytes) != \
                        (task.cost.oracle_calls, task.cost.oracle_batches, task.cost.upload_bytes) \
                        or (r.compute_times is not None and r.compute_times[i] != task.compute):
                    raise RuntimeError(f"algorithm {self.cfg.algorithm.name!r}: client {c}'s step cost {cost}, but its"
                                       f" plan_costs said {task.cost}; the buffered and async schedules time a client by"
                                       " plan_costs before it trains")
                self.replies[task.seq] = r.replies[i]
                self.cpu[task.seq] = float(cpu[i])

    def _until_buffered(self) -> None:
        """Run the clock until `buffer` arrivals are in: clients start in free slots at each instant once its events
        are processed, compute, queue and arrive (buffered and async)."""
        tl, e = self.timeline, self.engine
        while not tl.full():
            if tl.settled() and tl.free() > 0:
                self._start(tl.free())
            if not tl.events:  # nobody in flight: the clock moves on to when a client comes online
                wake = e.system.availability.next_online(tl.now) if tl.eligible(e.fed.num_clients).size else np.inf
                if wake == np.inf:
                    raise RuntimeError(f"schedule: no client can start at simulated time {tl.now:g} or later and none"
                                       f" is in flight ({len(tl.arrived)} of {tl.buffer} arrivals buffered)")
                tl.now = wake
                continue
            tl.step()

    def _until_period(self) -> None:
        """Run the clock through one semi_sync round: clients_per_round clients start when it opens, and it closes
        `period` later with whatever arrived (stragglers of earlier rounds included)."""
        tl = self.timeline
        assert self.schedule.period is not None  # ScheduleConfig.problems: semi_sync has a period
        if tl.starts == 0:
            self._start(self.cfg.algorithm.clients_per_round)
        close = tl.updated_at + self.schedule.period
        while tl.events and tl.events[0][0] <= close:
            tl.step()
        tl.now = close

    def advance(self, round: int, train: Trainer) -> UpdateOutcome:
        """Run the clock to server update `round` (`buffer` arrivals, or a semi_sync round's period), then apply it."""
        t0 = time.perf_counter()
        tl, e = self.timeline, self.engine
        before = tl.updated_at
        if self.schedule.kind == "semi_sync":
            self._until_period()
        else:
            self._until_buffered()
        applied, dropped = tl.update()
        for t in dropped:
            self.untrained.get(t.version, {}).pop(t.seq, None)
            self.replies.pop(t.seq, None)
        for v in sorted({t.version for t in applied if t.seq not in self.replies}):
            self._train(v, train)
        now = e.state
        mix = self.schedule.kind == "async"
        alpha = self.schedule.alpha if mix else 1.0
        assert self.schedule.staleness is not None  # resolved
        leaves = [(t.client, 1, e.algo.stale(self.replies.pop(t.seq), alpha * staleness_weight(t.staleness, self.schedule.staleness),
                                             self.states[t.version], now, mix)) for t in applied]
        total = tree_reduce(leaves, 0, root_size(e.fed.num_clients), lambda a, b: e.algo.reduce([a, b]))
        e.state, server_cost = e.algo.aggregate(now, [] if total is None else [total],
                                                stream(self.cfg.seed, round, SERVER, "aggregate"))
        if e.system.calls(server_cost):
            raise RuntimeError(f"algorithm {self.cfg.algorithm.name!r}: its aggregation makes oracle calls, which the"
                               " buffered and async schedules do not time (their server updates are instantaneous)")
        self.states[tl.version] = e.state
        needed = {t.version for t in tl.tasks.values()} | {tl.version}
        self.states = {v: s for v, s in self.states.items() if v in needed}
        self.broadcasts = {v: b for v, b in self.broadcasts.items() if v in needed}
        delivered = applied + dropped
        unit = e.system.calls
        gamma = max((unit(t.cost) for t in applied), default=0) + unit(server_cost) \
            + self.cfg.system.comm.phi * sum(t.cost.upload_vectors for t in delivered)
        started, self.started = self.started, 0
        totals = e.ledger.book(gamma, tl.updated_at - before,
                               sum(t.cost.oracle_calls for t in delivered) + server_cost.oracle_calls,
                               sum(t.cost.upload_bytes for t in delivered),
                               sum(t.download for t in delivered))
        return UpdateOutcome(round, applied, dropped, started, server_cost, totals, tl.updated_at - before, t0)

    def rows(self, out: UpdateOutcome, restarts: int = 0, saved: bool = False,
             evals: dict[str, np.ndarray] | None = None) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        """The update's results row (one per server update), its delivered tasks' rows as columns, and the federated
        evaluation's rows."""
        metrics, eval_rows = self.engine.metrics(out.round, evals)
        tasks = out.applied + out.dropped
        stale = np.array([t.staleness for t in out.applied], dtype=np.int64)
        row = {
            "round": out.round,
            "phase": "update",
            "clients": len(out.applied),
            "selected": out.started,
            "dropped": len(out.dropped),
            "arrivals": len(tasks),
            "staleness_mean": float(stale.mean()) if stale.size else 0.0,  # 0 with none applied: NaN reads as divergence
            "staleness_max": int(stale.max()) if stale.size else 0,
            "offline": sum(t.lost for t in out.dropped),
            "in_flight": len(self.timeline.tasks),
            "available": int(self.engine.system.availability.available(self.timeline.now, out.round, "available").sum()),
            **out.totals,
            "server_oracle_calls": out.server_cost.oracle_calls,
            "server_oracle_batches": out.server_cost.oracle_batches,
            "round_sim_time": out.sim_time,
            "round_wall_s": time.perf_counter() - out.started_wall,
            "client_cpu_s": float(np.nansum([self.cpu.get(t.seq, np.nan) for t in tasks])),
            "actor_restarts": restarts,
            "checkpoint": saved,
            **metrics,
        }
        applied = np.array([True] * len(out.applied) + [False] * len(out.dropped))
        client_rows = {
            "round": np.full(len(tasks), out.round, dtype=np.int64),
            "client_id": np.array([t.client for t in tasks], dtype=np.int64),
            "version_sent": np.array([t.version for t in tasks], dtype=np.int64),
            "version_applied": np.where(applied, out.round, -1).astype(np.int64),
            "staleness": np.array([t.staleness for t in tasks], dtype=np.int64),
            "oracle_calls": np.array([t.cost.oracle_calls for t in tasks], dtype=np.int64),
            "oracle_batches": np.array([t.cost.oracle_batches for t in tasks], dtype=np.int64),
            "upload_vectors": np.array([t.cost.upload_vectors for t in tasks], dtype=np.float64),
            "upload_bytes": np.array([t.cost.upload_bytes for t in tasks], dtype=np.int64),
            "download_bytes": np.array([t.download for t in tasks], dtype=np.int64),
            "start_time": np.array([t.start for t in tasks], dtype=np.float64),
            "compute_time": np.array([t.compute for t in tasks], dtype=np.float64),
            "compute_end": np.array([t.compute_end for t in tasks], dtype=np.float64),
            "upload_time": np.array([t.upload_end - t.compute_end for t in tasks], dtype=np.float64),
            "finish_time": np.array([np.nan if t.lost else t.upload_end for t in tasks], dtype=np.float64),
            "end_time": np.array([t.ended for t in tasks], dtype=np.float64),
            "dropped": ~applied if len(tasks) else np.zeros(0, dtype=bool),
            "offline": np.array([t.lost for t in tasks], dtype=bool),
            "cpu_s": np.array([self.cpu.pop(t.seq, np.nan) for t in tasks], dtype=np.float64),
        }
        return row, client_rows, eval_rows

    def save(self, folder: Path) -> dict[str, dict[str, Any]]:
        """Write the server's state and ledger and the clock's (its tasks, replies and versions) into `folder`."""
        files = self.engine.save(folder)
        files.update(checkpoint.save(checkpoint.dumps((self.timeline, self.states, self.broadcasts, self.untrained,
                                                       self.replies, self.cpu, self.started)), folder / "schedule.pkl"))
        return files

    def load(self, folder: Path) -> None:
        """Take the server's state, ledger and clock from checkpoint `folder`."""
        self.engine.load(folder)
        (self.timeline, self.states, self.broadcasts, self.untrained,
         self.replies, self.cpu, self.started) = checkpoint.load(folder / "schedule.pkl")
