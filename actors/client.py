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
    """A ClientShard that answers the server actor."""

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
