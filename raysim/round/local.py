"""`backend: local`: a whole experiment in this process, through the same round engine and client
shard as on Ray, for tests, debugging and notebooks. Same seed, the same numbers as `backend: ray`."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysim.core.device import process_device
from raysim.data import FederatedData
from raysim.round.engine import RoundEngine
from raysim.round.experiment import Experiment
from raysim.round.scheduled import ScheduledEngine
from raysim.round.shard import ClientShard
from raysim.storage import checkpoint


class LocalServer:
    """The round engine and one shard holding every client, on one torch thread (as each client
    actor of a run with one CPU per actor), whose batched steps use a thread per CPU (`cluster.num_cpus`,
    default all this process may use); `close` gives the process its thread count back."""

    def __init__(self, experiment: Experiment, data: dict, run_dir: str | Path | None = None):
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self.experiment, self.data = experiment.install(), data
        self.device = process_device(experiment.cfg.model.device, "the local backend's process")
        self.engine = RoundEngine(experiment, FederatedData.from_dict(data), self.device)
        self.scheduled = ScheduledEngine(self.engine) if experiment.cfg.schedule.scheduled else None
        self.run_dir = Path(run_dir) if run_dir else None
        self.shard: ClientShard | None = None

    def start(self) -> dict:
        """Load every client's data into the one shard."""
        t0 = time.perf_counter()
        threads = self.experiment.cfg.cluster.num_cpus or len(os.sched_getaffinity(0))
        self.shard = ClientShard(self.experiment, self.data, range(self.engine.fed.num_clients), threads=threads,
                                 device=self.device)
        self.shard.warm_up()  # torch's one-time costs are not the first round's clients' CPU seconds
        return {"backend": "local", "actors": 0, "clients_per_actor": self.engine.fed.num_clients, "device": self.device,
                "torch_threads": 1, "shard_threads": self.shard.threads, "actors_s": time.perf_counter() - t0}

    def resume(self, folder: str | Path) -> None:
        """Continue from the checkpoint in `folder` (the runner's verified choice)."""
        assert self.shard is not None, "start() first"
        (self.scheduled or self.engine).load(Path(folder))
        self.shard.restore(folder, [])

    def run_round(self, round: int) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        """One round: the engine's plan, the shard's steps, the engine's aggregation, the federated evaluation
        (`eval.clients`) and the rows."""
        assert self.shard is not None, "start() first"
        if self.scheduled is not None:
            return self._run_update(round)
        rp = self.engine.plan(round)
        results = [self.shard.train(round, rp.clients, rp.plan.broadcast, rp.reduce)] if len(rp.clients) else []
        out = self.engine.aggregate(rp, results)
        ids = self.engine.eval_clients(rp.round, rp.clients)
        evals = self.shard.evaluate(ids, self.engine.eval_payload()) if ids is not None else None
        saved = self.run_dir is not None and self.engine.checkpoint_due(round)
        if saved:
            self.checkpoint(round)
        return self.engine.rows(rp, out, saved=saved, evals=evals)

    def _run_update(self, round: int) -> tuple[dict, dict[str, np.ndarray], dict[str, np.ndarray] | None]:
        """Server update `round` of a buffered or async schedule: the clock runs to it, the shard training the tasks
        of each server version as one batch."""
        assert self.shard is not None and self.scheduled is not None
        shard = self.shard
        out = self.scheduled.advance(round, lambda key, clients, broadcast: [shard.train(key, clients, broadcast, False)])
        ids = self.engine.eval_clients(round, np.array([t.client for t in out.applied], dtype=np.int64))
        evals = self.shard.evaluate(ids, self.engine.eval_payload()) if ids is not None else None
        saved = self.run_dir is not None and self.engine.checkpoint_due(round)
        if saved:
            self.checkpoint(round)
        return self.scheduled.rows(out, saved=saved, evals=evals)

    def checkpoint(self, round: int) -> None:
        """Save the server's and every client's state after `round` (the round just run), then the manifest."""
        assert self.run_dir is not None and self.shard is not None, "checkpoints need a run directory and start()"
        folder = checkpoint.checkpoint_dir(self.run_dir, round)
        checkpoint.write_manifest(folder, round, {**(self.scheduled or self.engine).save(folder), **self.shard.save(folder)})

    def state(self) -> Any:
        """The algorithm's server state (callbacks see a copy)."""
        return self.engine.state

    def close(self) -> None:
        torch.set_num_threads(self.threads)
