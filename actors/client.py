"""ClientActor: hosts a shard of logical clients — their data, their estimator state — and runs
the algorithm's client step for those selected in a round. Only (Reply, Cost) leaves the actor."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from raysim import checkpoint
from raysim.contract import ClientData
from raysim.data import FederatedData, read_clients
from raysim.experiment import Experiment
from raysim.models import DTYPES
from raysim.rng import SERVER, stream
from raysim.system import SystemModel


@dataclass
class ShardResult:
    """What a shard sends back for a round: per-client costs, sampled compute times and measured CPU
    seconds, and the replies — one pre-reduced reply of the clients within the deadline when the
    server asked for it."""

    clients: list[int]
    costs: list
    compute_times: list[float]
    replies: list
    reduced: bool
    real_seconds: float = 0.0
    cpu_seconds: list[float] | None = None


class ClientShard:
    """The actor's logic without Ray, so the same code runs in-process in tests."""

    def __init__(self, experiment: Experiment, data: dict, clients: list[int], torch_threads: int = 1,
                 cuda_memory_fraction: float | None = None, shard: int = 0):
        torch.set_num_threads(torch_threads)
        device = "cpu"
        if cuda_memory_fraction is not None and torch.cuda.is_available():
            torch.cuda.set_per_process_memory_fraction(cuda_memory_fraction)
            device = "cuda"
        self.cfg = experiment.install().cfg
        self.fed = FederatedData.from_dict(data)
        self.algo = experiment.algorithm_for(self.fed, device)
        dtype = DTYPES[self.cfg.model.dtype]
        self.data = {
            c: ClientData(c, torch.tensor(x, dtype=dtype, device=device), torch.tensor(y, device=device))
            for c, (x, y) in read_clients(self.fed.train_path, clients).items()
        }
        self.shard, self.clients = shard, clients
        self.states: dict[int, Any] = {c: self.algo.client_init(c) for c in clients}
        self.system = SystemModel(self.cfg.system, self.cfg.seed, self.fed.num_clients)

    def ready(self) -> dict:
        """Under `clock: real`, run one discarded step first: the process's one-time torch warm-up
        (about 2 s) would otherwise make round 1's clients stragglers of the real clock."""
        if self.cfg.system.clock.mode == "real" and self.data:
            c = next(iter(self.data))
            plan = self.algo.plan(self.algo.init(), 0, stream(self.cfg.seed, 0, SERVER, "warm_up"))
            self.algo.step(self.states[c], self.data[c], plan.broadcast, stream(self.cfg.seed, 0, c, "warm_up"))
        return {"clients": len(self.data), "node": ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""}

    def save(self, ckpt: str) -> None:
        """Write this shard's client states into the checkpoint folder `ckpt`."""
        checkpoint.save(ray.cloudpickle.dumps(self.states), checkpoint.shard_path(Path(ckpt), self.shard))

    def restore(self, ckpt: str | None, replay: list[tuple[int, list[int], Any]]) -> None:
        """Refill client states after a restart: from checkpoint `ckpt` (None: client_init), then
        re-run the logged rounds since it (round, this shard's clients, broadcast) to reach the present."""
        self.states = (checkpoint.load(checkpoint.shard_path(Path(ckpt), self.shard)) if ckpt
                       else {c: self.algo.client_init(c) for c in self.clients})
        for round, clients, broadcast in replay:
            self._steps(round, clients, ray.get(broadcast) if isinstance(broadcast, ray.ObjectRef) else broadcast)

    def _steps(self, round: int, clients: list[int], broadcast: Any, fail: bool = False) -> tuple[list, list[float]]:
        """The clients' steps for `round` (updating their states) and the CPU seconds of each (this
        process's); a vectorized step's time is split in proportion to oracle calls. `fail` kills
        the process after the first step."""
        datas = [self.data[c] for c in clients]
        states = [self.states[c] for c in clients]
        rngs = [stream(self.cfg.seed, round, c, "step") for c in clients]
        if fail:  # an injected fault (config `faults:`): die mid-round, after some of the work
            self.algo.step(states[0], datas[0], broadcast, rngs[0])
            os._exit(1)
        if self.cfg.algorithm.vectorize:
            t0 = time.process_time()
            outs = self.algo.step_many(states, datas, broadcast, rngs)
            calls = np.array([o[2].oracle_calls for o in outs], dtype=np.float64)
            share = calls / calls.sum() if calls.sum() > 0 else np.full(len(outs), 1 / max(len(outs), 1))
            cpu = (share * (time.process_time() - t0)).tolist()
        else:
            outs, cpu = [], []
            for s, d, r in zip(states, datas, rngs):
                t0 = time.process_time()
                outs.append(self.algo.step(s, d, broadcast, r))
                cpu.append(time.process_time() - t0)
        for c, o in zip(clients, outs):
            self.states[c] = o[1]
        return outs, cpu

    def train(self, round: int, clients: list[int], broadcast: Any, reduce: bool, fail: bool = False) -> ShardResult:
        """Run `clients`' step for `round`; sleep their sampled time under `clock: real`."""
        t0 = time.perf_counter()
        outs, cpu = self._steps(round, clients, broadcast, fail)
        replies = [o[0] for o in outs]
        costs = [o[2] for o in outs]
        times = self.system.client_compute_times(round, clients, costs).tolist()
        clock = self.cfg.system.clock
        if clock.mode == "real":
            time.sleep(max(times) * clock.time_scale)
        if reduce:
            deadline = self.cfg.system.stragglers.deadline
            kept = [r for r, t in zip(replies, times) if deadline is None or t <= deadline]
            replies = [self.algo.reduce(kept)] if kept else []
        return ShardResult(clients, costs, times, replies, reduce, time.perf_counter() - t0, cpu)


@ray.remote
class ClientActor(ClientShard):
    """A Ray actor around ClientShard; placed with a CPU share or a fractional GPU (actors/placement.py)."""
