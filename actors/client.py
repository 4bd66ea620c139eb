"""ClientActor: a shard of logical clients (raysim.shard) in its own Ray process, placed with a CPU
share or a fractional GPU (actors/placement.py); under `clock: real` it sleeps the sampled time."""
from __future__ import annotations

import time
from typing import Any

import ray

from raysim.shard import ClientShard, ShardResult


@ray.remote
class ClientActor(ClientShard):
    """A ClientShard that answers the server actor."""

    def ready(self) -> dict:
        """Warm up under `clock: real`; report the node this actor runs on."""
        if self.cfg.system.clock.mode == "real":
            self.warm_up()
        return {"clients": len(self.data), "node": ray.get_runtime_context().get_node_id()}

    def restore(self, ckpt: str | None, replay: list[tuple[int, list[int], Any]]) -> None:
        """ClientShard.restore with the replayed broadcasts fetched from the object store."""
        super().restore(ckpt, [(t, cs, ray.get(b) if isinstance(b, ray.ObjectRef) else b) for t, cs, b in replay])

    def train(self, round: int, clients: list[int], broadcast: Any, reduce: bool, fail: bool = False) -> ShardResult:
        """ClientShard.train; under `clock: real` the reply leaves after the clients' sampled time."""
        result = super().train(round, clients, broadcast, reduce, fail)
        clock = self.cfg.system.clock
        if clock.mode == "real":
            time.sleep(max(result.compute_times) * clock.time_scale)
        return result
