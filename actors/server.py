"""ServerActor: drives synchronized rounds — plan, broadcast once, collect shard results, drop
stragglers, aggregate, sample the system model, evaluate — and hands the driver one row a round."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from raysim.actors.client import ClientActor, ShardResult
from raysim import checkpoint
from raysim.actors.placement import client_resources, client_scheduling
from raysim.contract import EvalData
from raysim.data import FederatedData, read_table_arrays
from raysim.experiment import Experiment
from raysim.models import DTYPES
from raysim.rng import SERVER, SETUP, stream
from raysim.system import Ledger, SystemModel


RESTART_TIMEOUT_S = 120.0  # how long a dead client actor may take to come back


def eval_data(fed: FederatedData, dtype: torch.dtype, train_samples: int, seed: int) -> EvalData:
    """The test set and a seeded sample of at most `train_samples` pooled training samples."""
    tx, ty = read_table_arrays(fed.test_path)
    x, y = read_table_arrays(fed.train_path)
    if len(y) > train_samples:
        keep = np.sort(stream(seed, SETUP, SERVER, "eval_train").choice(len(y), train_samples, replace=False))
        x, y = x[keep], y[keep]
    return EvalData(torch.tensor(tx, dtype=dtype), torch.tensor(ty), torch.tensor(x, dtype=dtype), torch.tensor(y))


class Server:
    """The server's round logic; `ServerActor` runs it in its own process."""

    def __init__(self, experiment: Experiment, data: dict, run_dir: str | None = None):
        torch.set_num_threads(1)
        self.experiment = experiment.install()
        self.cfg = experiment.cfg
        self.fed = FederatedData.from_dict(data)
        self.algo = experiment.algorithm_for(self.fed, "cpu")
        self.state = self.algo.init()
        self.system = SystemModel(self.cfg.system, self.cfg.seed, self.fed.num_clients)
        self.ledger = Ledger()
        self.eval = eval_data(self.fed, DTYPES[self.cfg.model.dtype], self.cfg.eval.train_samples, self.cfg.seed)
        self.actors: list = []
        self.per_actor = 1
        self.run_dir = Path(run_dir) if run_dir else None
        self.ckpt: str | None = None  # the newest complete checkpoint's folder
        self.replay: list[tuple[int, dict[int, list[int]], Any]] = []  # rounds since it: (round, shard -> clients, broadcast ref)
        self.faults = {(f.round, f.actor) for f in self.cfg.faults}
        self.restarts = 0

    def start(self) -> dict:
        """Create the client actors (each reads only its clients' rows) and wait until all are ready."""
        t0 = time.perf_counter()
        res = ray.cluster_resources()
        n_actors, self.per_actor = self.cfg.actor_layout(int(res.get("CPU", 1)))
        r = client_resources(self.cfg.cluster, n_actors, res.get("CPU", 1), res.get("GPU", 0))
        if n_actors * r.num_cpus > res.get("CPU", 1) + 1e-9:
            raise ValueError(f"cluster.cpus_per_actor: {n_actors} client actors x {r.num_cpus} CPUs exceed the"
                             f" cluster's {res.get('CPU', 1):g} CPUs; the actors could never all start")
        # real clock: one call per client; late ones still sleep while the next round starts
        concurrency = 2 * self.per_actor if self.cfg.system.clock.mode == "real" else 1
        n = self.fed.num_clients
        for i in range(n_actors):
            clients = list(range(i * self.per_actor, min(n, (i + 1) * self.per_actor)))
            actor = ClientActor.options(**r.options(), max_concurrency=concurrency, max_restarts=-1,
                                        scheduling_strategy=client_scheduling()).remote(
                self.experiment, self.fed.to_dict(), clients, r.torch_threads, r.cuda_memory_fraction, i)
            self.actors.append(actor)
        bad = sorted(a for _, a in self.faults if a >= n_actors)
        if bad:
            raise ValueError(f"faults: actor {bad[0]} does not exist; this run has client actors 0..{n_actors - 1}")
        nodes = [info["node"] for info in ray.get([a.ready.remote() for a in self.actors])]
        return {"actors": n_actors, "clients_per_actor": self.per_actor, "actor_cpus": r.num_cpus,
                "actor_gpus": r.num_gpus, "torch_threads": r.torch_threads, "actor_nodes": nodes,
                "actors_s": time.perf_counter() - t0}

    def resume(self) -> None:
        """Load the run's newest checkpoint (if any) into the server and every shard."""
        found = checkpoint.latest(self.run_dir)
        if found is not None:
            self.state, self.ledger = checkpoint.load(found[1] / "server.pkl")
            self.ckpt = str(found[1])
            ray.get([a.restore.remote(self.ckpt, []) for a in self.actors])

    def _checkpoint(self, round: int) -> None:
        """Save server and client state after `round` and forget the replay log; the driver commits
        the checkpoint once the round's results are on disk, so a resume never skips a round's row."""
        folder = checkpoint.checkpoint_dir(self.run_dir, round)
        checkpoint.save(ray.cloudpickle.dumps((self.state, self.ledger)), folder / "server.pkl")
        ray.get([a.save.remote(str(folder)) for a in self.actors])
        self.ckpt, self.replay = str(folder), []

    def _recover(self, shard: int, round: int, clients: list[int], bref, reduce: bool) -> ShardResult:
        """A dead client actor (restarted by Ray) gets its clients' state back, then redoes the round."""
        self.restarts += 1
        actor = self.actors[shard]
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:  # Ray restarts the process (max_restarts); calls fail until it is back
            try:
                ray.get(actor.ready.remote())
                break
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        log = [(t, by_shard[shard], b) for t, by_shard, b in self.replay if shard in by_shard]
        ray.get(actor.restore.remote(self.ckpt, log))
        return ray.get(actor.train.remote(round, clients, bref, reduce))

    def _shards(self, clients: np.ndarray) -> dict[int, list[int]]:
        """The round's clients grouped by the actor that hosts them."""
        by_actor: dict[int, list[int]] = {}
        for c in clients.tolist():
            by_actor.setdefault(c // self.per_actor, []).append(c)
        return by_actor

    def _dispatch(self, round: int, by_actor: dict[int, list[int]], bref, reduce: bool) -> dict:
        """Send each shard its clients (one call per client under `clock: real`); ref -> (shard, its clients)."""
        if self.cfg.system.clock.mode == "real":
            return {self.actors[a].train.remote(round, [c], bref, False): (a, [c]) for a, cs in by_actor.items() for c in cs}
        return {self.actors[a].train.remote(round, cs, bref, reduce, (round, a) in self.faults): (a, cs)
                for a, cs in by_actor.items()}

    def _collect(self, round: int, refs: dict, bref, reduce: bool, keep: int | None) -> tuple[list[ShardResult], set[int]]:
        """All shard results (virtual clock; a dead actor is recovered), or those that arrived in real
        time (deadline, first `keep`)."""
        if self.cfg.system.clock.mode == "virtual":
            results = []
            for ref, (shard, clients) in refs.items():
                try:
                    results.append(ray.get(ref))
                except ray.exceptions.RayActorError:
                    self.faults.discard((round, shard))
                    results.append(self._recover(shard, round, clients, bref, reduce))
            return results, set()
        clock, strag = self.cfg.system.clock, self.cfg.system.stragglers
        timeout = None if strag.deadline is None else strag.deadline * clock.time_scale
        ready, late = ray.wait(list(refs), num_returns=keep or len(refs), timeout=timeout)
        return ray.get(ready), {c for ref in late for c in refs[ref][1]}

    def run_round(self, round: int) -> tuple[dict, list[dict]]:
        """One synchronized round; returns the results row and the per-client rows."""
        t0 = time.perf_counter()
        plan = self.algo.plan(self.state, round, stream(self.cfg.seed, round, SERVER, "plan"))
        clients = np.asarray(plan.clients, dtype=np.int64)
        over = self.cfg.system.stragglers.over_select
        keep = self.cfg.algorithm.clients_per_round if over > 0 else None
        reduce = self.algo.reducible and keep is None and self.cfg.system.clock.mode == "virtual"
        results: list[ShardResult] = []
        late: set[int] = set()
        if len(clients):
            bref = ray.put(plan.broadcast)
            by_actor = self._shards(clients)
            results, late = self._collect(round, self._dispatch(round, by_actor, bref, reduce), bref, reduce, keep)
            self.replay.append((round, by_actor, bref))
        by_client = {c: (r, i) for r in results for i, c in enumerate(r.clients)}
        arrived = np.array([c for c in clients.tolist() if c in by_client], dtype=np.int64)
        costs = [by_client[c][0].costs[by_client[c][1]] for c in arrived.tolist()]
        times = np.array([by_client[c][0].compute_times[by_client[c][1]] for c in arrived.tolist()])
        cpu = [by_client[c][0].cpu_seconds[by_client[c][1]] for c in arrived.tolist()]
        if self.cfg.system.clock.mode == "real":  # what arrived in real time is kept; the rest is `late`
            dropped = np.zeros(len(arrived), dtype=bool)
        else:
            dropped, _ = self.system.stragglers(arrived, times, keep)
        if reduce:
            replies = [rep for r in results for rep in r.replies]
        else:
            kept = {c for c, d in zip(arrived.tolist(), dropped) if not d}
            replies = [by_client[c][0].replies[by_client[c][1]] for c in arrived.tolist() if c in kept]
        self.state, server_cost = self.algo.aggregate(self.state, replies, stream(self.cfg.seed, round, SERVER, "aggregate"))
        server_time = self.system.server_compute_time(round, server_cost)
        timing = self.system.close_round(round, arrived, times, costs, server_cost, server_time, dropped)
        totals = self.ledger.add(timing, costs, server_cost)
        last = round == self.cfg.algorithm.rounds
        every = self.cfg.checkpoint.every
        saved = self.run_dir is not None and every > 0 and (round % every == 0 or last)
        if saved:
            self._checkpoint(round)
        metrics = self.algo.evaluate(self.state, self.eval) if (round % self.cfg.eval.every == 0 or last) else {}
        lost = sorted(late)
        row = {
            "round": round,
            "phase": plan.phase,
            "clients": int(len(arrived) - dropped.sum()),
            "selected": int(len(clients)),
            "dropped": int(dropped.sum()) + len(lost),
            **totals,
            "round_sim_time": timing.round_time,
            "round_wall_s": time.perf_counter() - t0,
            "client_cpu_s": float(sum(cpu)),
            "actor_restarts": self.restarts,
            "checkpoint": bool(saved),
            **metrics,
        }
        client_rows = [
            {"round": round, "client_id": c, "oracle_calls": cost.oracle_calls,
             "upload_bytes": 0 if d else cost.upload_bytes, "compute_time": float(timing.compute_time[i]),
             "upload_time": float(timing.upload_time[i]), "finish_time": float(timing.finish_time[i]),
             "dropped": bool(d), "cpu_s": cpu[i]}
            for i, (c, cost, d) in enumerate(zip(arrived.tolist(), costs, timing.dropped))
        ] + [{"round": round, "client_id": c, "oracle_calls": 0, "upload_bytes": 0, "compute_time": np.nan,
              "upload_time": 0.0, "finish_time": np.nan, "dropped": True, "cpu_s": np.nan} for c in lost]
        return row, client_rows

    def get_state(self) -> Any:
        return self.state


@ray.remote(num_cpus=0)
class ServerActor(Server):
    """The server in its own Ray process, so the driver only receives the results rows."""
