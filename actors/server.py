"""The server on Ray: runs the round engine (raysim.round.engine) and moves the data: starts the client
actors, puts each round's broadcast in the object store once, dispatches the shards, collects their
results (in real time under `clock: real`), restarts dead actors and checkpoints.

`RoundServer` runs in the driver's process (`cluster.server: driver`, the default: no second torch
process to start and hold) or, as `ServerActor`, in a process of its own on the cluster
(`cluster.server: actor`, the default when the driver joins through Ray Client, `ray://`)."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import ray
import torch

from raysim.actors.client import ClientActor, StateLost
from raysim.actors.placement import ActorResources, client_resources, client_scheduling
from raysim.config import ExperimentConfig
from raysim.core.device import process_device
from raysim.data import FederatedData
from raysim.errors import ConfigError
from raysim.round.engine import RoundEngine, RoundPlan, shards_of
from raysim.round.experiment import Experiment
from raysim.round.scheduled import ScheduledEngine
from raysim.round.shard import ClientShard, ShardResult
from raysim.storage import checkpoint
from raysim.system import payload_bytes

RESTART_TIMEOUT_S = 120.0  # how long a dead client actor may take to come back
INLINE_BYTES = 100_000  # broadcasts that all of a round's calls carry in fewer bytes go inline (Ray's own inline limit)
REPLY_GRACE_S = 0.5  # real clock: how long replies that left before the deadline may take to arrive
LOST = (ray.exceptions.RayActorError, StateLost)  # a client actor died, or Ray restarted it without its state


@dataclass
class ClientFleet:
    """A run's client actors and where its shards live (shard 0 in this process when `here`)."""

    actors: dict[int, Any]  # shard -> its client actor, not yet loaded with data
    shards: int
    per_actor: int
    resources: ActorResources
    here: bool

    def close(self) -> None:
        for actor in self.actors.values() if ray.is_initialized() else []:
            ray.kill(actor)
        self.actors = {}


def _driver_shard(experiment: Experiment, res: dict) -> bool:
    """Whether this process hosts shard 0 (`cluster.driver_shard`; by default when it is the driver of a
    one-node CPU cluster under the virtual clock without injected faults: nothing then needs the shard remote)."""
    cfg = experiment.cfg
    if cfg.cluster.driver_shard is not None:
        return cfg.cluster.driver_shard
    return (ray.get_runtime_context().get_actor_id() is None and not _gpus(cfg, res) and not cfg.faults
            and cfg.system.clock.mode == "virtual" and sum(n["Alive"] for n in ray.nodes()) == 1)


def _gpus(cfg: ExperimentConfig, res: dict) -> float:
    """The cluster's GPUs the client actors share (none under `model.device: cpu`)."""
    gpus = res.get("GPU", 0.0) if cfg.model.device != "cpu" else 0.0
    if cfg.model.device == "cuda" and not gpus:
        raise ConfigError("model.device: cuda, but the Ray cluster has no GPUs")
    return gpus


def launch(experiment: Experiment) -> ClientFleet:
    """Start the client actors of a run, without their data: the runner launches them before it builds the
    data, so their processes boot meanwhile (about 2 s a process: a Ray worker, then torch)."""
    cfg = experiment.cfg
    res = ray.cluster_resources()
    n_actors, per_actor = cfg.actor_layout(int(res.get("CPU", 1)))
    r = client_resources(cfg.cluster, n_actors, res.get("CPU", 1), _gpus(cfg, res))
    if n_actors * r.num_cpus > res.get("CPU", 1) + 1e-9:
        raise ConfigError(f"cluster.cpus_per_actor: {n_actors} client actors x {r.num_cpus} CPUs exceed the"
                          f" cluster's {res.get('CPU', 1):g} CPUs; the actors could never all start")
    bad = sorted(f.actor for f in cfg.faults if f.actor >= n_actors)
    if bad:
        raise ConfigError(f"faults: actor {bad[0]} does not exist; this run has client actors 0..{n_actors - 1}")
    # real clock: one call per client; late ones still sleep while the next round starts
    concurrency = 2 * per_actor if cfg.system.clock.mode == "real" else 1
    n, here = cfg.data.num_clients, _driver_shard(experiment, res)
    actors = {}
    for i in range(1 if here else 0, n_actors):
        # a range, not a list: 500k ids would make a constructor argument that Ray keeps in the object
        # store, and flags for an actor that may restart
        clients = range(i * per_actor, min(n, (i + 1) * per_actor))
        # mypy ignores class decorators: it does not see that @ray.remote made ClientActor an ActorClass
        actors[i] = ClientActor.options(**r.options(), max_concurrency=concurrency, max_restarts=-1,  # type: ignore[attr-defined]
                                        scheduling_strategy=client_scheduling()).remote(
            experiment, clients, r.torch_threads, r.cuda_memory_fraction, i, r.threads)
    return ClientFleet(actors, n_actors, per_actor, r, here)


def _carried(rp: RoundPlan, calls: int) -> Any:
    """The round's broadcast as `calls` calls carry it: in the object store once, or (small, to few calls)
    inline in each call, with no store round trip."""
    return rp.plan.broadcast if rp.broadcast_bytes * calls <= INLINE_BYTES else ray.put(rp.plan.broadcast)


@dataclass
class Sent:
    """A round sent to the client actors: its plan, its shards' clients, the broadcast (or its reference)
    and each actor's call in flight."""

    rp: RoundPlan
    by_actor: dict[int, np.ndarray]
    bref: Any
    refs: dict[int, Any]  # shard -> the ObjectRef of its actor's result


class RoundServer:
    """The server's side of a run on Ray, on one torch thread (as every client actor, so the numbers
    do not depend on where it runs); `close` stops the client actors and gives the thread count back."""

    def __init__(self, experiment: Experiment, data: dict, run_dir: str | None = None, fleet: ClientFleet | None = None):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.experiment = experiment.install()
        self.cfg = experiment.cfg
        self.data = data
        # the server evaluates on a GPU where its process has one (model.device: auto or cuda), else on the CPU
        self.device = process_device("cpu" if self.cfg.model.device == "cpu" else "auto", "the server's process")
        self.engine = RoundEngine(experiment, FederatedData.from_dict(data), self.device)
        self.scheduled = ScheduledEngine(self.engine) if self.cfg.schedule.scheduled else None
        self.actors: dict[int, Any] = {}  # shard -> its client actor
        self.local: ClientShard | None = None  # shard 0 in this process (cluster.driver_shard)
        self.per_actor = 1
        self.run_dir = Path(run_dir) if run_dir else None
        self.ckpt: str | None = None  # the newest complete checkpoint's folder
        self.snapshots: dict[int, Any] | None = None  # or, newer than it, each actor's in-memory snapshot (ObjectRefs)
        self.replay: list[tuple[int, dict[int, np.ndarray], Any]] = []  # rounds since: (round, shard -> clients, broadcast ref)
        self.faults = {(f.round, f.actor) for f in self.cfg.faults}
        self.restarts = 0
        self.fleet = fleet  # client actors launched before the data were built, if any
        self.sent: Sent | None = None  # the next round, already sent to the client actors

    def start(self) -> dict:
        """Load the client actors (launched now, unless the runner launched them before the data) with their
        clients' rows, and build shard 0 here while they read when the driver hosts it; wait until all are ready."""
        t0 = time.perf_counter()
        fleet = self.fleet or launch(self.experiment)
        self.fleet, self.actors, self.per_actor = None, fleet.actors, fleet.per_actor
        loads = [a.load.remote(self.data) for a in self.actors.values()]
        if fleet.here:
            self.local = ClientShard(self.experiment, self.data, range(min(self.engine.fed.num_clients, self.per_actor)),
                                     fleet.resources.torch_threads, threads=fleet.resources.threads)
        ray.get(loads)
        nodes = [info["node"] for info in ray.get([a.ready.remote() for a in self.actors.values()])]
        r = fleet.resources
        return {"backend": "ray", "server": "driver" if ray.get_runtime_context().get_actor_id() is None else "actor",
                "shards": fleet.shards, "actors": len(self.actors), "driver_shard": fleet.here,
                "clients_per_actor": self.per_actor, "actor_cpus": r.num_cpus,
                "actor_gpus": r.num_gpus, "server_device": self.device, "torch_threads": r.torch_threads, "shard_threads": r.threads, "actor_nodes": nodes,
                "actors_s": time.perf_counter() - t0}

    def resume(self, folder: str) -> None:
        """Load the checkpoint in `folder` (the runner's verified choice) into the server and every shard."""
        (self.scheduled or self.engine).load(Path(folder))
        self.ckpt = folder
        refs = {i: a.restore.remote(folder, []) for i, a in self.actors.items()}
        if self.local is not None:
            self.local.restore(folder, [])
        for i, ref in refs.items():
            self._settle(i, ref, lambda actor: None)

    def state(self) -> Any:
        """The algorithm's server state (callbacks see a copy)."""
        return self.engine.state

    def close(self) -> None:
        """Stop the client actors (after the round sent ahead, when a run stops early: no error is left
        unread); the process gets its torch thread count back."""
        if self.sent is not None and self.sent.refs and ray.is_initialized():
            ray.wait(list(self.sent.refs.values()), num_returns=len(self.sent.refs), timeout=RESTART_TIMEOUT_S)
        self.sent = None
        for actor in self.actors.values() if ray.is_initialized() else []:
            ray.kill(actor)
        self.actors, self.local = {}, None
        torch.set_num_threads(self.threads)

    def _checkpoint(self, round: int) -> None:
        """Save server and client state after `round`, then the manifest, and forget the replay log; the driver
        commits the checkpoint once the round's results are on disk, so a resume never skips a round's row."""
        assert self.run_dir is not None, "checkpoints need a run directory"
        folder = str(checkpoint.checkpoint_dir(self.run_dir, round))
        refs = {i: a.save.remote(folder) for i, a in self.actors.items()}
        files = (self.scheduled or self.engine).save(Path(folder))
        if self.local is not None:
            files.update(self.local.save(folder))
        for i, ref in refs.items():
            files.update(self._settle(i, ref, lambda actor: actor.save.remote(folder)))
        checkpoint.write_manifest(Path(folder), round, files)
        self.ckpt, self.snapshots, self.replay = folder, None, []

    def checkpoint(self, round: int) -> None:
        """Checkpoint after `round`, the last round of a run that stops (a callback or a signal), unless its
        own checkpoint was taken: the round sent ahead is waited for, and the actors it reached are brought
        back to `round` (their last checkpoint or snapshot and the rounds logged since) before they save."""
        assert self.run_dir is not None, "checkpoints need a run directory"
        if self.ckpt == str(checkpoint.checkpoint_dir(self.run_dir, round)):
            return
        ahead, self.sent = self.sent, None
        if ahead is not None and ahead.refs:
            ray.wait(list(ahead.refs.values()), num_returns=len(ahead.refs), timeout=RESTART_TIMEOUT_S)
            deadline = time.monotonic() + RESTART_TIMEOUT_S
            for shard in ahead.refs:
                self._revive(shard, deadline)
        self._checkpoint(round)

    def _bound_replay(self) -> None:
        """After `checkpoint.replay_rounds` rounds without a checkpoint, every shard's client states are
        snapshotted in the object store and the logged broadcasts released: memory stays flat however long the run.
        Shard 0 in this process needs none: it cannot die without the run."""
        if len(self.replay) >= self.cfg.checkpoint.replay_rounds:
            refs = {i: a.snapshot.remote() for i, a in self.actors.items()}  # (size, states) each
            for i in refs:
                def again(actor: Any, i: int = i) -> Any:
                    refs[i] = actor.snapshot.remote()
                    return refs[i][0]
                self._settle(i, refs[i][0], again)
            self.snapshots, self.replay = {i: states for i, (_, states) in refs.items()}, []

    def _revive(self, shard: int, deadline: float) -> None:
        """Bring shard's client actor to the present: (re)load its data if Ray restarted it, then restore its
        clients' states from the last checkpoint or snapshot and replay the rounds logged since."""
        actor = self.actors[shard]
        log = [(t, by_shard[shard], b) for t, by_shard, b in self.replay if shard in by_shard]
        while True:  # Ray restarts the process (max_restarts) without its data; calls fail until it is back
            try:
                ray.get(actor.load.remote(self.data))
                ray.get(actor.restore.remote(self.ckpt if self.snapshots is None else self.snapshots[shard], log))
                return
            except LOST:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _settle(self, shard: int, ref: Any, again: Callable[[Any], Any]) -> Any:
        """The result of `ref`, a call to shard's client actor. If that actor died or lost its state, whenever
        Ray restarted it, it is revived and `again(actor)` calls it anew, until it answers or
        RESTART_TIMEOUT_S passes (`again` returning None: reviving it was the call)."""
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while True:
            try:
                return ray.get(ref)
            except LOST:
                if time.monotonic() > deadline:
                    raise
                self.restarts += 1
                self._revive(shard, deadline)
                ref = again(self.actors[shard])
                if ref is None:
                    return None

    def _dispatch(self, round: int) -> Sent:
        """Plan `round` and send each client actor its shard's clients (under the virtual clock)."""
        rp = self.engine.plan(round)
        by_actor = shards_of(rp.clients, self.per_actor) if len(rp.clients) else {}
        bref = _carried(rp, len(by_actor.keys() & self.actors.keys()))
        refs = {a: self.actors[a].train.remote(round, cs, bref, rp.reduce, (round, a) in self.faults)
                for a, cs in by_actor.items() if a in self.actors}
        return Sent(rp, by_actor, bref, refs)

    def _virtual(self, sent: Sent) -> list[ShardResult]:
        """Every shard's result for its clients (a dead actor is restarted and redoes its share); shard 0,
        when this process hosts it, trains while the actors do."""
        rp, results = sent.rp, []
        if self.local is not None and 0 in sent.by_actor:
            results.append(self.local.train(rp.round, sent.by_actor[0], rp.plan.broadcast, rp.reduce))
        for shard, ref in sent.refs.items():
            def again(actor: Any, shard: int = shard) -> Any:
                self.faults.discard((rp.round, shard))
                return actor.train.remote(rp.round, sent.by_actor[shard], sent.bref, rp.reduce)
            results.append(self._settle(shard, ref, again))
        return results

    def _real(self, rp: RoundPlan, by_actor: dict[int, np.ndarray], bref) -> tuple[list[ShardResult], set[int]]:
        """Under `clock: real`, one call per client; the deadline counts from dispatch. A reply is kept
        if it left by the deadline and is among the first `keep` to leave; replies that left in time get
        REPLY_GRACE_S more to arrive, so neither transit nor this process's scheduling decides."""
        clock, strag = self.cfg.system.clock, self.cfg.system.stragglers
        dispatched = time.time()
        refs = {self.actors[a].train_real.remote(rp.round, c, bref, dispatched): c
                for a, cs in by_actor.items() for c in cs.tolist()}
        cutoff = math.inf if strag.deadline is None else dispatched + strag.deadline * clock.time_scale
        need = rp.keep or len(refs)
        ready, pending = ray.wait(list(refs), num_returns=need,
                                  timeout=None if cutoff == math.inf else max(0.0, cutoff - time.time()))
        if pending and len(ready) < need:
            more, pending = ray.wait(pending, num_returns=len(pending), timeout=REPLY_GRACE_S)
            ready += more
        left = sorted(ray.get(ready), key=lambda reply: reply[1])
        kept = [result for result, at in left if at <= cutoff][:need]
        return kept, set(refs.values()) - {r.clients[0] for r in kept}

    def _send_eval(self, clients: np.ndarray) -> tuple[dict[int, Any], dict[int, np.ndarray], Any, Any]:
        """Ask each shard holding some of `clients` for their federated evaluation (before the next round's steps
        reach it, so it sees this round's client states): the refs, each shard's clients, the payload and what
        carries it (itself, or its ref)."""
        by_actor = shards_of(clients, self.per_actor)
        payload = self.engine.eval_payload()
        carried = payload if payload_bytes(payload) * len(by_actor) <= INLINE_BYTES else ray.put(payload)
        refs = {a: self.actors[a].evaluate.remote(cs, carried) for a, cs in by_actor.items() if a in self.actors}
        return refs, by_actor, payload, carried

    def _gather_eval(self, sent: tuple[dict[int, Any], dict[int, np.ndarray], Any, Any]) -> dict[str, np.ndarray]:
        """The shards' federated evaluation columns, joined in client order (shard 0 evaluated here meanwhile)."""
        refs, by_actor, payload, carried = sent
        parts = []
        if self.local is not None and 0 in by_actor:
            parts.append(self.local.evaluate(by_actor[0], payload))
        for shard, ref in refs.items():
            def again(actor: Any, cs: np.ndarray = by_actor[shard]) -> Any:
                return actor.evaluate.remote(cs, carried)
            parts.append(self._settle(shard, ref, again))
        joined = {n: np.concatenate([p[n] for p in parts]) for n in parts[0]}
        order = np.argsort(joined["client_id"], kind="stable")
        return {n: v[order] for n, v in joined.items()}

    def _train(self, round: int, clients: list[int] | np.ndarray, broadcast: Any) -> list[ShardResult]:
        """The steps of `clients` (a buffered or async schedule's tasks of one server version, `round` their key) on
        their shards, logged for a restarted actor's replay like a round's."""
        by_actor = shards_of(clients, self.per_actor)
        bref = broadcast if payload_bytes(broadcast) * len(by_actor) <= INLINE_BYTES else ray.put(broadcast)
        refs = {a: self.actors[a].train.remote(round, cs, bref, False) for a, cs in by_actor.items() if a in self.actors}
        results = [self.local.train(round, by_actor[0], broadcast, False)] if self.local is not None and 0 in by_actor else []
        for shard, ref in refs.items():
            def again(actor: Any, shard: int = shard) -> Any:
                return actor.train.remote(round, by_actor[shard], bref, False)
            results.append(self._settle(shard, ref, again))
        self.replay.append((round, by_actor, bref))
        return results

    def _run_update(self, round: int) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        """Server update `round` of a buffered or async schedule: the clock runs to it, and the tasks of each server
        version train as one call to each shard that hosts some of them."""
        assert self.scheduled is not None
        out = self.scheduled.advance(round, self._train)
        saved = self.run_dir is not None and self.engine.checkpoint_due(round)
        if saved:
            self._checkpoint(round)
        else:
            self._bound_replay()
        ids = self.engine.eval_clients(round, np.array([t.client for t in out.applied], dtype=np.int64))
        evals = self._gather_eval(self._send_eval(ids)) if ids is not None else None
        return self.scheduled.rows(out, self.restarts, saved, evals)

    def run_round(self, round: int) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        """One synchronized round (or, under a buffered or async schedule, one server update); returns the results row, the per-client rows and the federated evaluation's
        rows. Under the virtual clock the next round goes to the client actors once this one's replies are in the
        state, before its timing is booked (unless the next plan reads it) and before it is evaluated: they train
        while this process books, evaluates and the runner writes (the same calls, so the same numbers); a federated
        evaluation goes to them before it."""
        if self.scheduled is not None:
            return self._run_update(round)
        if self.cfg.system.clock.mode == "real":  # the real clock restarts no actor: nothing to replay
            rp = self.engine.plan(round)
            results: list[ShardResult] = []
            late: set[int] = set()
            if len(rp.clients):
                by_actor = shards_of(rp.clients, self.per_actor)
                results, late = self._real(rp, by_actor, _carried(rp, len(rp.clients)))
        else:
            assert self.sent is None or self.sent.rp.round == round, "rounds run in order"
            started = time.perf_counter()
            sent, self.sent = self.sent or self._dispatch(round), None
            sent.rp.started = started  # a round sent ahead overlapped the last one: its wall time counts from here
            rp, results, late = sent.rp, self._virtual(sent), set()
            if len(rp.clients):
                self.replay.append((round, sent.by_actor, sent.bref))
        updated = self.engine.update(rp, results, late)
        saved = self.run_dir is not None and self.engine.checkpoint_due(round)
        ahead = self.cfg.system.clock.mode == "virtual" and round < self.cfg.algorithm.rounds
        early = ahead and not saved and self.engine.timing_free()
        out = None if early else self.engine.settle(updated)
        if saved:
            self._checkpoint(round)
        else:
            self._bound_replay()
        ids = self.engine.eval_clients(rp.round, rp.clients)
        asked = self._send_eval(ids) if ids is not None else None
        if ahead:
            self.sent = self._dispatch(round + 1)
        if out is None:
            out = self.engine.settle(updated)
        evals = self._gather_eval(asked) if asked is not None else None
        return self.engine.rows(rp, out, self.restarts, saved, evals)


ServerActor = ray.remote(num_cpus=0)(RoundServer)
