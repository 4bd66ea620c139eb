"""Where a GPU round's time goes: one shard of the GPU benchmark's workload (benchmarks/gpu.py) driven round by
round in this process, as the local backend drives it.

It prints
- the undrained round and its parts (the server's plan, the shard's `train`, the aggregation, the rows), medians,
- the calls that wait for the device in one round (torch's sync debug mode: the raysim frames that called them),
- a torch.profiler summary of three rounds: kernels a round, launches and their host time, the device busy time,
  and the ops by host time,
- the phases of a shard's round, each timed with the device drained (the batch plans, local SGD, the uploads, the
  compute-time quantiles, the reduction tree, the server's parts), and beside the round's batch plans (from 2,048
  clients drawn by the host's compiled kernel on every core and copied) the same plans drawn by torch's operations
  on the device (checked equal): which way is the faster.

A round bound by the host's launches shows launches' host time near the round and the device busy for a fraction
of it; a wait in the middle of a round stops the host's quantiles overlapping the device's steps.

    python benchmarks/gpu_profile.py                 # on a machine with a CUDA device, 10^4 clients a round
    python benchmarks/gpu_profile.py --per-round 1000 --device cpu

Not a timed test.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from gpu import config
from raysim import plugins
from raysim.config import load_config
from raysim.core.keys import Keys
from raysim.data import build_federated
from raysim.round.engine import RoundEngine
from raysim.round.experiment import Experiment
from raysim.round.reduction import reduce_stacked
from raysim.round.shard import ClientShard, ShardResult
from raysim.training.local_sgd import BatchPlan, _device_plans, _passes


class Rounds:
    """The engine and one shard holding every client, on `device`, with the shard's host threads."""

    def __init__(self, per_round: int, device: str):
        torch.set_num_threads(1)
        cfg = load_config(config(per_round, 1000, "local", device))
        self.device, self.cfg = device, cfg
        self.fed = build_federated(cfg.data, cfg.seed, Path(tempfile.mkdtemp()))
        exp = Experiment(cfg, plugins.ALGORITHMS.lookup(cfg.algorithm.name), cfg.algorithm_params())
        self.engine = RoundEngine(exp, self.fed, device)
        self.shard = ClientShard(exp, self.fed.to_dict(), range(self.fed.num_clients),
                                 threads=len(os.sched_getaffinity(0)), device=device)
        self.round = 0

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def one(self) -> dict[str, float]:
        """A round as the local backend runs it; the seconds of its parts."""
        self.round += 1
        t0 = time.perf_counter()
        rp = self.engine.plan(self.round)
        t1 = time.perf_counter()
        res = self.shard.train(self.round, rp.clients, rp.plan.broadcast, rp.reduce)
        t2 = time.perf_counter()
        out = self.engine.aggregate(rp, [res])
        t3 = time.perf_counter()
        self.engine.rows(rp, out)
        t4 = time.perf_counter()
        return {"plan": t1 - t0, "train": t2 - t1, "aggregate": t3 - t2, "rows": t4 - t3, "round": t4 - t0}

    def phases(self) -> dict[str, float]:
        """One round's phases, each timed with the device drained."""
        self.round += 1
        r, shard, algo, times = self.round, self.shard, self.shard.algo, {}
        self.sync()
        t = time.perf_counter()

        def tick(name: str) -> None:
            nonlocal t
            self.sync()
            now = time.perf_counter()
            times[name], t = now - t, now

        rp = self.engine.plan(r)
        tick("server: plan")
        ids = rp.clients
        batch, keys = shard.data.batch(ids), Keys(self.cfg.seed, r, ids, "step")
        u = shard.system.compute_uniforms(r, ids)
        tick("data, keys and compute-time uniforms")
        plans = algo._plans(batch.sizes, keys, algo.batch_width)
        tick("batch plans")
        drawn = self.device_plans(batch.sizes, ids, r)
        tick("(or plans drawn by device ops)")
        if not all(torch.equal(a, b) for a, b in ((drawn.idx, plans.idx), (drawn.w, plans.w))):
            raise AssertionError("the device's batch plans differ from the round's")
        deltas = algo._train(None, batch, plans, rp.plan.broadcast)
        tick("local SGD")
        replies, costs = algo._uploads(deltas, batch.sizes, keys)
        tick("uploads")
        compute_times = shard.system.client_compute_times(r, ids, costs, u)  # one call, as a GPU shard's
        tick("compute-time quantiles")
        parts = reduce_stacked(ids, replies, shard.blocks)
        tick("reduction tree")
        out = self.engine.aggregate(rp, [ShardResult(ids, costs, compute_times, [], np.zeros(len(ids)), parts)])
        tick("server: aggregate")
        self.engine.rows(rp, out)
        tick("server: rows")
        return times

    def device_plans(self, sizes: np.ndarray, ids: np.ndarray, r: int) -> BatchPlan:
        """The round's batch plans drawn on the device by torch's operations (the path below COMPILED_MIN clients):
        the alternative to the host's compiled draw and one copy, the same plans bit for bit."""
        p, algo = self.shard.algo.params, self.shard.algo
        n, b, per_epoch, steps = _passes(sizes, p.batch_size, p.local_steps, p.local_epochs)
        return _device_plans(n, b, per_epoch, steps, -(-steps // per_epoch), Keys(self.cfg.seed, r, ids, "step"),
                             max(int(b.max()), algo.batch_width or 0), torch.device(self.device))


def waits(rounds: Rounds) -> collections.Counter:
    """The raysim frames (innermost first) of every call that waits for the device in one round."""
    sites: collections.Counter = collections.Counter()

    def seen(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        frames = [f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[:-1]
                  if "raysim" in f.filename or "algorithms" in f.filename]
        sites[" <- ".join(reversed(frames[-4:])) or "(outside raysim)"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = seen
        torch.cuda.set_sync_debug_mode("warn")
        try:
            rounds.one()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sites


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-round", type=int, default=10_000, help="clients a round")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=10, help="rounds behind each median")
    args = ap.parse_args(argv)
    rounds = Rounds(args.per_round, args.device)
    for _ in range(3):  # warm-up: the process's first kernels and allocations
        rounds.one()
    rounds.sync()
    parts = collections.defaultdict(list)
    for _ in range(args.rounds):
        for k, v in rounds.one().items():
            parts[k].append(1e3 * v)
    print(f"{args.per_round:,} clients a round on {args.device}, medians of {args.rounds} rounds (ms):")
    print("  undrained: " + ", ".join(f"{k} {np.median(v):.2f}" for k, v in parts.items()))
    if args.device == "cuda":
        print("  calls that wait for the GPU in one round (count, innermost raysim frame first):")
        for site, n in waits(rounds).most_common(20):
            print(f"    {n:4d}  {site}")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            rounds.one()
        rounds.sync()
    events = prof.key_averages()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    if kernels:
        print(f"  per round: {len(kernels) / 3:.0f} kernels and copies, the GPU busy "
              f"{sum(e.device_time for e in kernels) / 3 / 1e3:.2f} ms")
    for name in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cudaStreamSynchronize", "cudaMemcpyAsync"):
        for e in (e for e in events if e.key == name):
            print(f"  {name}: {e.count / 3:.0f} a round, {e.cpu_time_total / 3 / 1e3:.2f} ms of host time a round")
    print(events.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=50))
    phases = collections.defaultdict(list)
    for _ in range(args.rounds):
        for k, v in rounds.phases().items():
            phases[k].append(1e3 * v)
    print(f"phases of a round, each timed with the device drained (medians of {args.rounds}, ms):")
    for k, v in phases.items():
        print(f"  {k:38} {np.median(v):8.2f}")
    print(f"  {'total':38} {sum(np.median(v) for k, v in phases.items() if not k.startswith('(')):8.2f}"
          "  (without the parenthesized alternative)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
