"""Scale: logistic regression on Synthetic(1, 1) with 10^3 to 10^7 clients, 1,000 a round.

Prints, per federation size, the seconds to build the data, the start-up beyond the data, the real
seconds per steady round, the peak memory of all processes together (summed PSS of the driver and
its Ray session) and that memory per registered client. Memory should grow with the clients per
round and the data, not with the number of clients.

    python benchmarks/scale.py                      # 1e3, 1e4, 1e5 clients, 3 rounds each
    python benchmarks/scale.py --clients 1000000 10000000 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import ray

import raysim
from raysim import ray_session
from raysim.memory import PeakMemory, session_processes

SAMPLES_PER_CLIENT = 10


def config(clients: int, rounds: int, per_round: int) -> dict:
    """Multinomial logistic regression, Synthetic(1, 1) with 20 features, ~10 samples a client."""
    return {
        "name": f"scale-{clients}",
        "seed": 0,
        "data": {"source": "synthetic", "num_clients": clients, "partition": {"kind": "natural"},
                 "synthetic_samples": SAMPLES_PER_CLIENT * clients, "synthetic_features": 20},
        "model": {"name": "logreg"},
        "algorithm": {"name": "fedavg", "rounds": rounds, "clients_per_round": min(per_round, clients),
                      "lr": 0.05, "local_steps": 5, "batch_size": 5},
        "eval": {"train_samples": 5000},
        "checkpoint": {"every": 0},
    }


def measure(clients: int, rounds: int, per_round: int) -> dict:
    """One run on a fresh local Ray: start-up, steady seconds per round, peak summed PSS."""
    ray_session.start_local(num_cpus=2)
    session = ray._private.worker._global_node.get_session_dir_path()
    try:
        with PeakMemory(lambda: session_processes(session)) as mem, tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            result = raysim.run(config(clients, rounds, per_round), out=out)
            total = time.perf_counter() - t0
    finally:
        ray.shutdown()
    r = result.rounds
    return {"clients": clients, "per_round": min(per_round, clients), "startup_s": result.info["startup_s"],
            "data_s": result.info["data_s"], "round_s": float(r["round_wall_s"].iloc[1:].mean()),
            "total_s": total, "peak_pss_mb": mem.peak / 2**20, "test_accuracy": float(r["test_accuracy"].iloc[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--per-round", type=int, default=1_000)
    ap.add_argument("--json", help="also write the measurements to this JSON file")
    args = ap.parse_args()
    rows = []
    print(f"{'clients':>8} {'per round':>9} {'data s':>7} {'start-up beyond data s':>22} {'s/round':>8}"
          f" {'peak PSS MB':>11} {'bytes/client':>12} {'acc':>6}")
    for n in args.clients:
        m = measure(n, args.rounds, args.per_round)
        rows.append(m)
        print(f"{m['clients']:>8} {m['per_round']:>9} {m['data_s']:>7.1f} {m['startup_s'] - m['data_s']:>22.1f}"
              f" {m['round_s']:>8.2f} {m['peak_pss_mb']:>11.0f} {m['peak_pss_mb'] * 2**20 / m['clients']:>12.0f}"
              f" {m['test_accuracy']:>6.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
