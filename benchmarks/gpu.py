"""A round on one GPU against the GPU's vectorized limit and against the same run on the machine's CPUs.

The workload (issue 30): an MLP 20-256-10 on `synthetic` (10^5 clients of 10 samples, 20 features), 5 local steps of
batch 5, 10^4 clients a round, evaluation every 6 rounds, no checkpoints. It prints the steady round (the mean
round after the first) of
- raysim on Ray with one GPU client actor (`driver_shard: false`; the server evaluates on the GPU too),
- raysim's local backend on the GPU,
- raysim's local backend on the CPUs (`model.device: cpu`, a thread per CPU, each on one torch thread),
- the GPU vectorized limit: the same arithmetic in one process on the GPU with raysim's stacked kernel and nothing
  else (data stacked on the GPU, batch plans drawn beforehand),
and the ratios the issue sets: one GPU actor within 2x the GPU limit, at least 10x faster than the CPUs. The limit
runs once untimed first (7 rounds, an evaluation among them), so a fresh process's first kernels do not flatter the
ratios; `--repeats` measures the limit and the GPU runs again, each ratio within its repeat, and prints their
spread. With `--profile` it also prints where a local GPU round's host time goes (cProfile, top functions by own
time).

    python benchmarks/gpu.py                         # on a machine with a CUDA device
    python benchmarks/gpu.py --rounds 7 --per-round 1000 10000 --profile
    python benchmarks/gpu.py --skip-cpu --repeats 3
    python benchmarks/gpu.py --skip-cpu --shared 0     # also raysim's default layout: an actor per CPU on the card

Not a timed test: compare ratios measured in one run.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch

import raysim
from overhead import vectorized_limit
from raysim.runner import ray_session

CLIENTS, SAMPLES, FEATURES, HIDDEN = 100_000, 10, 20, 256
TARGET_LIMIT, TARGET_CPU = 2.0, 10.0  # issue 30


def config(per_round: int, rounds: int, backend: str, device: str, actors: int | None = 1) -> dict:
    """The issue's GPU workload at `per_round` clients a round, on `actors` client actors (None: raysim's default
    layout, an actor per CPU, sharing the machine's GPUs)."""
    return {
        "name": f"gpu-{per_round}", "seed": 0, "backend": backend,
        "data": {"source": "synthetic", "num_clients": CLIENTS, "partition": {"kind": "natural"},
                 "synthetic_samples": SAMPLES * CLIENTS, "synthetic_features": FEATURES},
        "model": {"name": "mlp", "hidden": [HIDDEN], "device": device},
        "algorithm": {"name": "fedavg", "rounds": rounds, "clients_per_round": per_round, "lr": 0.05,
                      "local_steps": 5, "batch_size": 5},
        "eval": {"every": 6, "train_samples": 5000, "test_samples": 10000},
        "checkpoint": {"every": 0},
        "cluster": {"driver_shard": False, **({} if actors is None else {"num_actors": actors})},
    }


def steady(tree: dict, profile: bool = False) -> tuple[float, dict, str]:
    """The mean wall seconds of rounds 2.. of one run, its info, and (with `profile`) its host profile."""
    prof = cProfile.Profile() if profile else None
    with tempfile.TemporaryDirectory() as out:
        if prof:
            prof.enable()
        result = raysim.run(tree, out=Path(out) / "run", progress=False)
        if prof:
            prof.disable()
    text = ""
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        text = buf.getvalue()
    return float(result.rounds["round_wall_s"].iloc[1:].mean()), result.info, text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-round", type=int, nargs="+", default=[10_000], help="clients a round")
    ap.add_argument("--rounds", type=int, default=13)
    ap.add_argument("--profile", action="store_true", help="print the host profile of a local GPU run")
    ap.add_argument("--skip-cpu", action="store_true", help="leave out the run on the CPUs")
    ap.add_argument("--shared", type=int, default=None, metavar="N",
                    help="also time N client actors sharing the GPU (0: the default layout, an actor per CPU)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure the limit and the GPU runs this many times, each ratio within its repeat (the CPUs once)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 2
    cpus = len(os.sched_getaffinity(0))
    print(f"{torch.cuda.get_device_name()}, {cpus} CPUs, torch {torch.__version__}, ray {ray.__version__}")
    ray_session.start_local()
    actors: dict[int, float] = {}
    try:
        for n in sorted(args.per_round):
            vectorized_limit(config(n, 7, "local", "cuda"), 1, "cuda")  # its first kernels, an evaluation's too: untimed
            ratios = []
            for r in range(args.repeats):
                limit = vectorized_limit(config(n, args.rounds, "local", "cuda"), 1, "cuda")
                actor, info, _ = steady(config(n, args.rounds, "ray", "auto"))
                assert info["actor_gpus"] == 1.0 and info["server_device"] == "cuda", info
                local, info, prof = steady(config(n, args.rounds, "local", "cuda"), args.profile and not r)
                assert info["device"] == "cuda", info
                cpu = steady(config(n, args.rounds, "local", "cpu"))[0] if not (args.skip_cpu or r) else float("nan")
                actors[n] = actor if r == 0 else min(actors[n], actor)
                ratios.append((actor / limit, local / limit))
                print(f"\n{n:,} clients a round, {args.rounds} rounds, repeat {r + 1} of {args.repeats}: steady round seconds")
                print(f"{'one GPU actor (Ray)':28} {actor:9.4f}  {actor / limit:6.2f}x the GPU limit (target <= {TARGET_LIMIT:g}x)")
                print(f"{'local backend on the GPU':28} {local:9.4f}  {local / limit:6.2f}x the GPU limit")
                if not r:
                    print(f"{f'local backend on {cpus} CPUs':28} {cpu:9.4f}  {cpu / actor:6.2f}x the GPU actor's round"
                          f" (target >= {TARGET_CPU:g}x)")
                if args.shared is not None:
                    shared, info, _ = steady(config(n, args.rounds, "ray", "auto", args.shared or None))
                    label = f"{info['actors']} GPU actors sharing it"
                    print(f"{label:28} {shared:9.4f}  {shared / limit:6.2f}x the GPU limit ({info['actor_gpus']:g} GPU each)")
                print(f"{'GPU vectorized limit':28} {limit:9.4f}")
                if prof:
                    print(f"\nhost profile of the local GPU run (all {args.rounds} rounds and start-up):\n{prof}")
            if args.repeats > 1:
                actor_x, local_x = (sorted(v) for v in zip(*ratios))
                print(f"\n{n:,} clients a round over {args.repeats} repeats: one GPU actor "
                      f"{', '.join(f'{x:.2f}x' for x in actor_x)} the GPU limit (worst {actor_x[-1]:.2f}x), "
                      f"local backend {', '.join(f'{x:.2f}x' for x in local_x)}")
        if len(actors) > 1:
            lo, hi = min(actors), max(actors)
            print(f"one GPU actor: marginal per client {lo:,} -> {hi:,}: {(actors[hi] - actors[lo]) / (hi - lo) * 1e6:.1f} us")
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    code = main()
    print(f"total {time.perf_counter() - t0:.0f} s")
    sys.exit(code)
