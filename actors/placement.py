"""Resources of the actors: a CPU share each, or a fractional GPU where the cluster has GPUs."""
from __future__ import annotations

import math
from dataclasses import dataclass

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raysim.config import ClusterConfig


@dataclass(frozen=True)
class ActorResources:
    """What one client actor asks Ray for, and what it sets up inside itself."""

    num_cpus: float
    num_gpus: float
    torch_threads: int
    cuda_memory_fraction: float | None
    threads: int = 1  # threads of its shard's host work (a CPU shard's batched steps): one per whole CPU its torch threads leave

    def options(self) -> dict:
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}


def _floor4(x: float) -> float:
    """Round down to Ray's resource precision (1e-4), so k shares of 1/k never exceed the whole."""
    return math.floor(x * 10_000) / 10_000


def client_resources(cluster: ClusterConfig, num_actors: int, total_cpus: float, total_gpus: float) -> ActorResources:
    """A fractional GPU (1/k, capped in CUDA memory to the same share) when GPUs exist, else a CPU share.

    Ray's fractional GPU only schedules; the memory cap keeps one actor from taking the card.
    Torch threads are `cluster.torch_threads`, at most the CPU share (more threads than cores slowed
    training steps 10-25x).
    """
    cpus = _floor4(cluster.cpus_per_actor or max(total_cpus / num_actors, 0.0001))
    threads = max(1, min(cluster.torch_threads, int(cpus)))
    if total_gpus > 0:
        frac = _floor4(cluster.gpu_fraction or min(1.0, total_gpus / num_actors))
        return ActorResources(cpus, frac, threads, frac, max(1, int(cpus) // threads))
    return ActorResources(cpus, 0.0, threads, None, max(1, int(cpus) // threads))


def client_scheduling() -> str | PlacementGroupSchedulingStrategy:
    """Client actors spread over the nodes; but when the server runs in a placement group that captures
    its children (a Ray Tune trial of `raysim sweep`), inside that group: any other explicit strategy
    would take them out of the trial's reserved bundles, and concurrent trials would starve each other."""
    pg = ray.util.get_current_placement_group()
    return "SPREAD" if pg is None else PlacementGroupSchedulingStrategy(pg)
