"""ClientActor: a shard of logical clients (raysim.shard) in its own Ray process, placed with a CPU
share or a fractional GPU (actors/placement.py); under `clock: real` a reply leaves at its sampled time."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray

from raysim.shard import ClientShard, ShardResult


@ray.remote
class ClientActor(ClientShard):
    """A ClientShard that answers the server. It starts without its data, so its process boots (Ray's worker,
    torch) while the driver builds them; `load` reads its clients' rows, and a restarted actor is loaded again."""

    def __init__(self, experiment: Any, clients: range, torch_threads: int = 1, cuda_memory_fraction: float | None = None,
                 shard: int = 0):
        self.args = (experiment, clients, torch_threads, cuda_memory_fraction, shard)
        self.loaded = False

    def load(self, data: dict) -> None:
        """Read this shard's clients' rows and set up their states (once)."""
        if not self.loaded:
            experiment, clients, threads, fraction, shard = self.args
            super().__init__(experiment, data, clients, threads, fraction, shard)
            self.loaded = True

    def ready(self) -> dict:
        """Warm up under `clock: real`; report the node this actor runs on."""
        if self.cfg.system.clock.mode == "real":
            self.warm_up()
        return {"clients": len(self.data), "node": ray.get_runtime_context().get_node_id()}

    def restore(self, ckpt: str | Path | bytes | None, replay: list[tuple[int, list[int], Any]]) -> None:
        """ClientShard.restore with the replayed broadcasts fetched from the object store."""
        super().restore(ckpt, [(t, cs, ray.get(b) if isinstance(b, ray.ObjectRef) else b) for t, cs, b in replay])

    def train_real(self, round: int, client: int, broadcast: Any, dispatched_at: float) -> tuple[ShardResult, float]:
        """One client under `clock: real`: its step, then the reply leaves at dispatch + its sampled time
        (scaled), or when the step ends if that is later. Returns the result and the wall time it left."""
        result = self.train(round, [client], broadcast, False)
        time.sleep(max(0.0, dispatched_at + result.compute_times[0] * self.cfg.system.clock.time_scale - time.time()))
        return result, time.time()
