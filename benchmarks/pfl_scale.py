"""raysim against pfl-research at 10^4 clients a round: issue 30's per-client-overhead workload on both.

The workload is benchmarks/overhead.py's: multinomial logistic regression on `synthetic` (20,000 clients of 10 samples
before the test holdout, 20 features), 10,000 clients a round, 5 local steps of batch 5 at lr 0.05, evaluation every
6 rounds and after the last. raysim runs it on each backend (`local`: one process; `ray`: two client actors,
`driver_shard: false`), as overhead.py does. pfl runs the task raysim exports (benchmarks/speed.py's `peer_task`: the
same split, initial weights, clients, minibatches, weights by samples and evaluation schedule) with
benchmarks/pfl_peer.py in its fastest CPU configuration here (two worker processes under torchrun, speed.py's
`pfl_command`), under the python of `.venv-pfl`; its final test accuracy must agree with raysim's within one test
sample. Every system runs in one invocation, one after another, and the script prints each one's steady round (the
mean of rounds 2.., evaluations included) and raysim's steady round as a fraction of pfl's.

    python benchmarks/pfl_scale.py --pfl .venv-pfl/bin/python                       # 7 rounds, both backends
    python benchmarks/pfl_scale.py --pfl .venv-pfl/bin/python --per-round 1000 10000 --rounds 13

Not a timed test: run it on an idle machine, and compare ratios measured in one run.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np

import raysim
from raysim.config import load_config


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


speed, overhead = load_benchmark("speed"), load_benchmark("overhead")


def raysim_round(per_round: int, rounds: int, backend: str, out: Path) -> tuple[float, float, float]:
    """raysim's steady round (mean wall seconds between round ends, rounds 2..), final test accuracy and loss."""
    clock = speed.RoundClock()
    result = raysim.run(overhead.config(per_round, rounds, backend), out=out, on_round=clock.mark, progress=False)
    last = result.rounds.iloc[-1]
    return float(np.mean(np.diff(clock.wall))), float(last["test_accuracy"]), float(last["test_loss"])


def pfl_round(python: str, per_round: int, rounds: int, work: Path) -> tuple[float, float, float, float]:
    """pfl's steady round (as raysim's, from its round events), final test accuracy and loss, and one test
    sample's share of the accuracy."""
    task = work / "task.npz"
    peer = speed.load_flower_peer()
    exported = speed.peer_task(load_config(overhead.config(per_round, rounds, "local")), work / "data")
    peer.write_task(task, exported)
    metrics, clock, *_ = speed.run_peer_task("pfl", python, task, rounds, work / "pfl.log")
    steady = float(np.mean(np.diff(clock.wall)[1:]))
    return steady, metrics["test_accuracy"], metrics["test_loss"], 1 / len(exported.test_y)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pfl", required=True,
                    help="python of the virtual environment with pfl (make bench-peers builds .venv-pfl)")
    ap.add_argument("--per-round", type=int, nargs="+", default=[10_000], help="clients a round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--backends", nargs="+", default=["local", "ray"], choices=["local", "ray"])
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds: at least 2 (round 1 is left out of the steady round)")
    print(f"{speed.machine()}; pfl: {speed.versions(args.pfl, 'pfl', 'torch')}, {speed.PFL_WORKERS} workers")
    print(f"{'clients/round':>13} {'system':>12} {'steady round s':>15} {'/ pfl':>7} {'test acc':>9} {'test loss':>10}")
    with tempfile.TemporaryDirectory(prefix="raysim-pfl-scale-") as tmp:
        for n in args.per_round:
            pfl_s, pfl_acc, pfl_loss, sample = pfl_round(args.pfl, n, args.rounds, Path(tmp) / f"pfl-{n}")
            print(f"{n:>13,} {'pfl':>12} {pfl_s:>15.4f} {1:>7.3f} {pfl_acc:>9.4f} {pfl_loss:>10.6f}", flush=True)
            for backend in args.backends:
                steady, acc, loss = raysim_round(n, args.rounds, backend, Path(tmp) / f"{backend}-{n}")
                print(f"{n:>13,} {'raysim ' + backend:>12} {steady:>15.4f} {steady / pfl_s:>7.3f} {acc:>9.4f} {loss:>10.6f}",
                      flush=True)
                gap = abs(acc - pfl_acc)
                assert gap <= sample, f"pfl's final test accuracy differs from raysim's by {gap:.1e} (> one test sample)"
    return 0


if __name__ == "__main__":
    sys.exit(main())
