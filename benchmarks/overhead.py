"""Per-client overhead of a round: what raysim spends on a client beyond its arithmetic.

The workload: multinomial logistic regression on `synthetic` (20,000 clients, 200,000 samples of 20 features: 10 a
client on average, sized by the FedProx generator's lognormal, so 3 to 1,218 training samples, median 4), 5 local
steps of batch 5, evaluation every 6 rounds, no checkpoints. For 1,000 and 10,000 clients a round it runs the
experiment on the local backend and on Ray with 2 client actors (`driver_shard: false`) and prints the steady
round (the mean round after the first), the marginal wall time per client between the two sizes (the target is
at most 5 us), and the ratio of each round to the vectorized limit: the same arithmetic in one process with
raysim's own stacked kernel and nothing else, on every core's torch threads (the target is at most 1.5 at
10,000). Both backends use both cores: Ray's two actors one each, the local backend a thread per core over
chunks of the round's clients, each on one torch thread (so its numbers match every layout's).

    python benchmarks/overhead.py                     # both backends, 13 rounds each
    python benchmarks/overhead.py --backends local --rounds 7 --sizes 1000 10000 100000
    python benchmarks/overhead.py --repeats 5        # five runs in turn, and how many met each target
    python benchmarks/overhead.py --phases           # and where a client's CPU goes, phase by phase (local backend)

Not a timed test: run it on an idle machine, and compare ratios measured in one run.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch

import raysim
from raysim.config import load_config
from raysim.contract import ClientBatch
from raysim.core.device import deterministic_cuda, host
from raysim.core.keys import Keys
from raysim.core.rng import SERVER, stream
from raysim.data import build_federated, read_table_arrays
from raysim.models import DTYPES
from raysim.round import shard
from raysim.round.engine import eval_data
from raysim.round.experiment import make_algorithm
from raysim.round.shard import ShardResult
from raysim.system.model import SystemModel
from raysim.training.local_sgd import LocalSGD

CLIENTS, SAMPLES, FEATURES = 20_000, 10, 20
TARGET_US, TARGET_LIMIT = 5.0, 1.5  # issue 30
PHASES = {"batch plans": (LocalSGD, "_plans"), "local SGD": (LocalSGD, "_train"), "uploads": (LocalSGD, "_uploads"),
          "compute-time quantiles": (SystemModel, "client_compute_times"), "reduction tree": (shard, "reduce_stacked")}


def config(per_round: int, rounds: int, backend: str) -> dict:
    """The issue's workload at `per_round` clients a round."""
    return {
        "name": f"overhead-{per_round}", "seed": 0, "backend": backend,
        "data": {"source": "synthetic", "num_clients": CLIENTS, "partition": {"kind": "natural"},
                 "synthetic_samples": SAMPLES * CLIENTS, "synthetic_features": FEATURES},
        "model": {"name": "logreg"},
        "algorithm": {"name": "fedavg", "rounds": rounds, "clients_per_round": per_round, "lr": 0.05,
                      "local_steps": 5, "batch_size": 5},
        "eval": {"every": 6, "train_samples": 5000},
        "checkpoint": {"every": 0},
        "cluster": {"num_actors": 2, "driver_shard": False, "num_cpus": 2},
    }


def steady_round(per_round: int, rounds: int, backend: str) -> float:
    """The mean wall seconds of rounds 2.. of one run."""
    with tempfile.TemporaryDirectory() as out:
        result = raysim.run(config(per_round, rounds, backend), out=Path(out) / "run", progress=False)
    return float(result.rounds["round_wall_s"].iloc[1:].mean())


def vectorized_limit(tree: dict, threads: int, device: str = "cpu") -> float:
    """Seconds a round of the experiment `tree`'s arithmetic takes in one process on `threads` torch threads and
    `device`: the stacked local steps of its clients a round (their data already stacked on the device, their batch
    plans drawn), the weighted mean, and the evaluation every `eval.every` rounds and at the last, as raysim's."""
    cfg = load_config(tree)
    dtype = DTYPES[cfg.model.dtype]
    if device == "cuda":
        deterministic_cuda(cfg.model.tf32)
    with tempfile.TemporaryDirectory() as out:
        fed = build_federated(cfg.data, cfg.seed, Path(out))
        algo = make_algorithm(cfg, fed, device)
        x, y = read_table_arrays(fed.train_path)
        offsets = np.concatenate([[0], np.cumsum(fed.client_sizes)])
        evaluation = eval_data(fed, dtype, cfg.eval.train_samples, cfg.seed, cfg.eval.test_samples).to(device)
    x, y = torch.as_tensor(x, dtype=dtype, device=device), torch.as_tensor(y, device=device)
    state = algo.init()
    times, before = [], torch.get_num_threads()
    torch.set_num_threads(threads)
    for t in range(1, cfg.algorithm.rounds + 1):
        plan = algo.plan(state, t, stream(cfg.seed, t, SERVER, "plan"))
        ids = np.sort(plan.clients)
        batch = ClientBatch(ids, offsets[ids], offsets[ids + 1] - offsets[ids], x, y)
        plans = algo._plans(batch.sizes, Keys(cfg.seed, t, ids, "step"), algo.batch_width)
        sync(device)
        t0 = time.perf_counter()
        deltas = algo._train(None, batch, plans, plan.broadcast)
        weights = torch.from_numpy(batch.sizes).to(device, deltas.dtype)
        state = type(state)(state.params + host((weights[:, None] * deltas).sum(0) / weights.sum()))
        if cfg.evaluates(t):  # as raysim's rounds: every eval.every rounds and the last
            algo.evaluate(state, evaluation)
        sync(device)
        times.append(time.perf_counter() - t0)
    torch.set_num_threads(before)
    return float(np.mean(times[1:]))


def sync(device: str) -> None:
    """Wait for the device's queued kernels (a GPU's run ahead of the host)."""
    if device == "cuda":
        torch.cuda.synchronize()


def phase_profile(per_round: int, rounds: int) -> dict[str, float]:
    """CPU microseconds a client of each phase of a shard's round on the local backend (every thread's CPU time in
    it, summed over the round's chunks): medians over rounds 2.., and the steady round's wall time (`round`)."""
    spent: dict[str, float] = collections.defaultdict(float)
    per_round_spent: dict[str, list[float]] = collections.defaultdict(list)
    train = shard.ClientShard.train

    def counted(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            t = time.thread_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[name] += time.thread_time() - t
        return call

    def one_round(*args: Any, **kwargs: Any) -> ShardResult:
        spent.clear()
        out = train(*args, **kwargs)
        for name in PHASES:
            per_round_spent[name].append(spent[name])
        return out

    with contextlib.ExitStack() as stack:  # each phase's function wrapped for the run, then restored
        for name, (owner, attr) in PHASES.items():
            stack.enter_context(mock.patch.object(owner, attr, counted(name, getattr(owner, attr))))
        stack.enter_context(mock.patch.object(shard.ClientShard, "train", one_round))
        out = stack.enter_context(tempfile.TemporaryDirectory())
        result = raysim.run(config(per_round, rounds, "local"), out=Path(out) / "run", progress=False)
    phases = {name: float(np.median(v[1:])) / per_round * 1e6 for name, v in per_round_spent.items()}
    return {**phases, "round": float(result.rounds["round_wall_s"].iloc[1:].median())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000], help="clients a round")
    ap.add_argument("--rounds", type=int, default=13)
    ap.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure the limit and every backend this many times in turn, then count the runs that met each target")
    ap.add_argument("--phases", action="store_true",
                    help="then the CPU a client of each phase of the local backend's round at the largest size")
    args = ap.parse_args(argv)
    sizes = sorted(args.sizes)
    lo, hi = sizes[0], sizes[-1]
    threads = {"local": torch.get_num_threads(), "ray": torch.get_num_threads()}
    met: dict[str, list[tuple[float, float]]] = {b: [] for b in args.backends}
    for repeat in range(1, args.repeats + 1):
        if args.repeats > 1:
            print(f"-- repeat {repeat} of {args.repeats}")
        limits = {k: {n: vectorized_limit(config(n, args.rounds, "local"), k) for n in sizes} for k in sorted(set(threads.values()))}
        print(f"{'backend':8} {'clients/round':>13} {'steady round s':>15} {'limit s':>9} {'threads':>8} {'vs limit':>9}")
        for backend in args.backends:
            limit = limits[threads[backend]]
            steady = {n: steady_round(n, args.rounds, backend) for n in sizes}
            for n in sizes:
                print(f"{backend:8} {n:>13,} {steady[n]:>15.4f} {limit[n]:>9.4f} {threads[backend]:>8} {steady[n] / limit[n]:>8.2f}x")
            ratio = steady[hi] / limit[hi]
            if hi == lo:  # one size: no marginal cost to take
                met[backend].append((float("nan"), ratio))
                continue
            marginal = (steady[hi] - steady[lo]) / (hi - lo) * 1e6
            met[backend].append((marginal, ratio))
            print(f"{backend:8} marginal per client {lo:,} -> {hi:,}: {marginal:.1f} us (target <= {TARGET_US:g} us; "
                  f"the limit's own {(limit[hi] - limit[lo]) / (hi - lo) * 1e6:.1f} us); "
                  f"{hi:,} clients at {ratio:.2f}x the vectorized limit (target <= {TARGET_LIMIT:g}x)")
    if args.repeats > 1:  # the machine's speed drifts between runs: how often each target held, and the medians
        for backend, runs in met.items():
            us, ratios = np.array(runs).T
            print(f"{backend:8} over {len(runs)} runs: marginal <= {TARGET_US:g} us in {int((us <= TARGET_US).sum())} "
                  f"(median {np.median(us):.1f} us); {hi:,} clients <= {TARGET_LIMIT:g}x the limit in "
                  f"{int((ratios <= TARGET_LIMIT).sum())} (median {np.median(ratios):.2f}x)")
    if args.phases:
        profile = phase_profile(hi, args.rounds)
        print(f"where a client's CPU goes at {hi:,} clients a round (local backend, every thread's CPU in each phase, "
              f"medians of rounds 2..; steady round {profile.pop('round'):.4f} s):")
        for name, us in profile.items():
            print(f"  {name:24} {us:5.2f} us a client")
        print(f"  {'together':24} {sum(profile.values()):5.2f} us a client")
    return 0


if __name__ == "__main__":
    sys.exit(main())
