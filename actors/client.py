"""ClientActor: a shard of logical clients (raysim.round.shard) in its own Ray process, placed with a CPU
share or a fractional GPU (actors/placement.py); under `clock: real` a reply leaves at its sampled time."""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray

from raysim.round.shard import ClientShard, ShardResult


class StateLost(RuntimeError):
    """A call reached a client actor that Ray restarted after its data were loaded: the new process has no data
    and no client states (the server reloads it and replays the rounds since its last checkpoint or snapshot)."""


@ray.remote
class ClientActor(ClientShard):
    """A ClientShard that answers the server. It starts without its data, so its process boots (Ray's worker,
    torch) while the driver builds them; `load` reads its clients' rows, and a restarted actor is loaded again:
    until then every call that needs them raises StateLost, whenever Ray restarted it."""

    def __init__(self, experiment: Any, clients: range, torch_threads: int = 1, cuda_memory_fraction: float | None = None,
                 shard: int = 0, threads: int = 1):
        self.args = (experiment, clients, torch_threads, cuda_memory_fraction, shard, threads)
        self.loaded = False

    def load(self, data: dict) -> None:
        """Read this shard's clients' rows and set up their states (once)."""
        if not self.loaded:
            experiment, clients, torch_threads, fraction, shard, threads = self.args
            super().__init__(experiment, data, clients, torch_threads, fraction, shard, threads)
            self.loaded = True

    def _loaded(self) -> None:
        if not self.loaded:
            raise StateLost(f"client actor {self.args[4]} was restarted and has not been loaded again")

    def ready(self) -> dict:
        """Warm up under `clock: real`; report the node this actor runs on."""
        self._loaded()
        if self.cfg.system.clock.mode == "real":
            self.warm_up()
        return {"clients": len(self.data), "node": ray.get_runtime_context().get_node_id()}

    def restore(self, ckpt: str | Path | bytes | None, replay: list[tuple[int, Sequence[int] | np.ndarray, Any]]) -> None:
        """ClientShard.restore with the replayed broadcasts fetched from the object store."""
        self._loaded()
        super().restore(ckpt, [(t, cs, ray.get(b) if isinstance(b, ray.ObjectRef) else b) for t, cs, b in replay])

    def train(self, round: int, clients: Sequence[int] | np.ndarray, broadcast: Any, reduce: bool,
              fail: bool = False) -> ShardResult:
        self._loaded()
        return super().train(round, clients, broadcast, reduce, fail)

    def evaluate(self, clients: Any, payload: Any) -> dict:
        self._loaded()
        return super().evaluate(clients, payload)

    def save(self, ckpt: str | Path) -> dict[str, dict[str, Any]]:
        self._loaded()
        return super().save(ckpt)

    @ray.method(num_returns=2)
    def snapshot(self) -> tuple[int, bytes]:  # type: ignore[override]
        """The shard's states pickled (ClientShard.snapshot), after their size: the server checks the small
        first return for a lost actor without fetching the states."""
        self._loaded()
        payload = super().snapshot()
        return len(payload), payload

    def train_real(self, round: int, client: int, broadcast: Any, dispatched_at: float) -> tuple[ShardResult, float]:
        """One client under `clock: real`: its step, then the reply leaves at dispatch + its sampled time
        (scaled), or when the step ends if that is later. Returns the result and the wall time it left."""
        result = self.train(round, [client], broadcast, False)
        assert result.compute_times is not None, "the real clock's shards time their clients (times_drop)"
        time.sleep(max(0.0, dispatched_at + result.compute_times[0] * self.cfg.system.clock.time_scale - time.time()))
        return result, time.time()
