"""Speed of raysim against the physical limit: FedAvg, MLP on digits, Dirichlet(0.5), as a user runs it.

Three systems run the same computation with the same seeds: raysim (Ray, client actors, vmap per
shard), a plain single-process torch loop over the clients (`sequential`), and that loop
vectorized with torch.func over the round's clients (`vectorized`, the physical limit on this
machine). A round selects `--per-round` clients (default 100, or all when fewer), the same ones in
every system (FedAvg's own plan); each runs 1 local epoch of minibatches of 10 at lr 0.05, drawn by
the fedavg family's own `batch_plan` from the stream (seed, round, client, "step"), and every
round ends with the server's evaluation. Each (system, clients) runs in a fresh process, so
start-up and memory are its own: start-up is from the process's launch to the first round begun
(imports and data included, as a user waits for them); peak memory is the PSS summed over that
process and all its descendants (Ray's processes for raysim), sampled by a background thread.
With `--repeats R` every figure is the median of R runs.

Run: python benchmarks/speed.py [--clients 10 100 1000] [--per-round 100] [--rounds 20] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from raysim.training import ServerState, batch_plan
from raysim.config import ExperimentConfig, load_config
from raysim.contract import EvalData
from raysim.data import build_federated, read_clients, read_table_arrays
from raysim.experiment import make_algorithm
from raysim.memory import PeakMemory
from raysim.models import DTYPES, ParamSpec, build_model
from raysim.rng import SERVER, stream

SYSTEMS = ("raysim", "sequential", "vectorized")
STEP_PURPOSE = "step"  # the stream a shard hands the client step (raysim/shard.py, ClientShard._steps)
PLAIN_FEDAVG = {"server_lr": 1.0, "weighting": "samples", "theta0": "model_init", "loss": "ce", "l2": 0.0,
                "lr_schedule": "constant", "quantizer": "none"}  # what the references implement
SAMPLE_EVERY_S = 0.5
ATTEMPTS = 3
MATCH_TOL = 1e-5
TARGETS = {"round_vs_vectorized": 1.3, "launch_vs_torch": 2.0, "pss_vs_torch": 2.5}  # issue 17


def experiment(num_clients: int, rounds: int, seed: int = 0, per_round: int | None = None) -> dict:
    """The workload as a raysim config: `per_round` clients a round (default all), 1 local epoch, batch 10, lr 0.05."""
    return {
        "name": f"speed-{num_clients}",
        "seed": seed,
        "data": {"source": "digits", "num_clients": num_clients, "test_fraction": 0.2,
                 "partition": {"kind": "dirichlet", "alpha": 0.5}},
        "model": {"name": "mlp", "hidden": [64], "dtype": "float32"},
        "algorithm": {"name": "fedavg", "rounds": rounds, "clients_per_round": min(per_round or num_clients, num_clients), "lr": 0.05,
                      "local_epochs": 1, "batch_size": 10},
    }


def process_tree() -> list[psutil.Process]:
    """This process and all its descendants (for raysim: Ray's daemons and workers)."""
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def tree_cpu_seconds() -> float:
    """User + system CPU seconds used so far by this process and its descendants."""
    total = 0.0
    for p in process_tree():
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


class Federation:
    """The references' in-process copy of the experiment: the same split, initial model and evaluation as raysim."""

    def __init__(self, cfg: ExperimentConfig, data_dir: Path):
        t0 = time.perf_counter()
        fed = build_federated(cfg.data, cfg.seed, data_dir)
        self.data_s = time.perf_counter() - t0
        self.cfg = cfg
        self.algo = make_algorithm(cfg, fed)
        unlike = {k: v for k, v in PLAIN_FEDAVG.items() if getattr(self.algo.params, k) != v}
        if unlike or self.algo.mu != 0.0:
            raise ValueError(f"the references implement plain FedAvg ({PLAIN_FEDAVG}, mu 0); config differs: {unlike}")
        self.dtype = DTYPES[cfg.model.dtype]
        self.module = build_model(cfg.model, fed.feature_shape, fed.image_shape, fed.num_classes)
        self.spec = ParamSpec.of(self.module)
        arrays = read_clients(fed.train_path, range(fed.num_clients))
        self.x = [torch.tensor(arrays[c][0], dtype=self.dtype) for c in range(fed.num_clients)]
        self.y = [torch.tensor(arrays[c][1]) for c in range(fed.num_clients)]
        self.sizes = np.asarray(fed.client_sizes)
        tx, ty = read_table_arrays(fed.test_path)
        x, y = read_table_arrays(fed.train_path)
        if len(y) > cfg.eval.train_samples:
            raise ValueError("the references evaluate on the whole training set; keep it under eval.train_samples")
        self.eval = EvalData(torch.tensor(tx, dtype=self.dtype), torch.tensor(ty),
                             torch.tensor(x, dtype=self.dtype), torch.tensor(y))

    def chosen(self, round: int) -> np.ndarray:
        """The clients of `round`, as FedAvg's plan selects them (uniformly, from the stream (seed, round, server))."""
        return np.asarray(self.algo.plan(self.algo.init(), round, stream(self.cfg.seed, round, SERVER, "plan")).clients)

    def plans(self, round: int, clients: np.ndarray) -> list:
        """Each chosen client's minibatches of `round`, drawn exactly as raysim's client step draws them."""
        p = self.algo.params
        return [batch_plan(int(self.sizes[c]), p.batch_size, p.local_steps, p.local_epochs,
                           stream(self.cfg.seed, round, int(c), STEP_PURPOSE)) for c in clients]

    def evaluate(self, theta: torch.Tensor) -> dict[str, float]:
        return self.algo.evaluate(ServerState(theta.numpy()), self.eval)


class Sequential:
    """A plain torch loop: one client after another, nn.Module + torch.optim.SGD, then the weighted average."""

    def __init__(self, fed: Federation):
        self.fed = fed
        self.params = list(fed.module.parameters())
        self.opt = torch.optim.SGD(self.params, lr=fed.algo.params.lr)

    def round(self, theta_g: torch.Tensor, round: int) -> torch.Tensor:
        fed, total = self.fed, torch.zeros_like(theta_g)
        chosen = fed.chosen(round)
        for c, plan in zip(chosen, fed.plans(round, chosen)):
            torch.nn.utils.vector_to_parameters(theta_g.clone(), self.params)  # it installs views of its input
            for idx, w in zip(plan.idx, plan.w):
                rows = torch.from_numpy(idx[w > 0])
                self.opt.zero_grad()
                F.cross_entropy(fed.module(fed.x[c][rows]), fed.y[c][rows]).backward()
                self.opt.step()
            total += float(fed.sizes[c]) * (torch.nn.utils.parameters_to_vector(self.params).detach() - theta_g)
        return theta_g + total / float(fed.sizes[chosen].sum())


class Vectorized:
    """The same round with torch.func: every client's parameters stacked, one vmap'd gradient per local step."""

    def __init__(self, fed: Federation):
        self.fed = fed
        k, nmax = len(fed.x), int(fed.sizes.max())
        self.xs = torch.zeros((k, nmax, *fed.x[0].shape[1:]), dtype=fed.dtype)
        self.ys = torch.zeros((k, nmax), dtype=torch.int64)
        for c, (x, y) in enumerate(zip(fed.x, fed.y)):
            self.xs[c, : len(y)], self.ys[c, : len(y)] = x, y
        self.vgrad = vmap(grad(self._loss))

    def _loss(self, params: dict, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the real samples of a minibatch (w = 0 marks padding)."""
        ce = F.cross_entropy(functional_call(self.fed.module, params, (x,)), y, reduction="none")
        return (w * ce).sum() / w.sum().clamp_min(1.0)

    def round(self, theta_g: torch.Tensor, round: int) -> torch.Tensor:
        fed = self.fed
        chosen = fed.chosen(round)
        plans = fed.plans(round, chosen)
        rows = torch.from_numpy(chosen)[:, None]
        sizes = torch.tensor(fed.sizes[chosen], dtype=fed.dtype)[:, None]
        k, steps, bsz = len(plans), max(len(p.idx) for p in plans), max(p.idx.shape[1] for p in plans)
        idx, w = np.zeros((k, steps, bsz), dtype=np.int64), np.zeros((k, steps, bsz))
        for c, p in enumerate(plans):
            idx[c, : p.idx.shape[0], : p.idx.shape[1]] = p.idx
            w[c, : p.w.shape[0], : p.w.shape[1]] = p.w
        idx, w = torch.from_numpy(idx), torch.from_numpy(w).to(fed.dtype)
        active = (w.sum(2, keepdim=True) > 0).to(fed.dtype)
        theta = theta_g.expand(k, -1).clone()
        lr = fed.algo.params.lr
        for s in range(steps):
            g = fed.spec.flatten(self.vgrad(fed.spec.unflatten(theta), self.xs[rows, idx[:, s]],
                                            self.ys[rows, idx[:, s]], w[:, s]))
            theta = theta - lr * active[:, s] * g
        return theta_g + (sizes / sizes.sum() * (theta - theta_g)).sum(0)


@dataclass
class Measurement:
    """One system at one client count: seconds, memory and the final model's metrics.

    round_s is the median real time of rounds 2.. (round 1 is `first_round_s`); cpu_round_s the mean
    CPU seconds those rounds used, summed over the process tree (robust to a shared machine; a mean,
    as the kernel counts CPU time in 10 ms ticks).
    """

    system: str
    clients: int
    rounds: int
    launch_s: float  # from the process's launch to round 1 begun: what a user waits for
    startup_s: float
    ray_up_s: float  # raysim's start-up: ray.init, then the server and client actors ready (0 for the references)
    actors_ready_s: float
    first_round_s: float
    round_s: float
    cpu_round_s: float
    peak_pss_mb: float
    processes: int
    test_accuracy: float
    test_loss: float
    train_loss: float


class RoundClock:
    """Real (perf_counter and epoch) and CPU (process tree) seconds at the end of each round; `mark` is an `on_round` callback."""

    def __init__(self):
        self.wall: list[float] = []
        self.epoch: list[float] = []
        self.cpu: list[float] = []

    def mark(self, *_) -> None:
        self.wall.append(time.perf_counter())
        self.epoch.append(time.time())
        self.cpu.append(tree_cpu_seconds())


def run_reference(system: str, cfg: ExperimentConfig, workdir: Path) -> tuple[torch.Tensor, dict, RoundClock, float]:
    """Run a reference for cfg's rounds: (final parameters, final metrics, clock marked before and after each round, start-up s)."""
    t0 = time.perf_counter()
    fed = Federation(cfg, workdir / "data")
    runner = (Sequential if system == "sequential" else Vectorized)(fed)
    theta = torch.tensor(fed.algo.init().params, dtype=fed.dtype)
    startup = time.perf_counter() - t0 - fed.data_s
    clock, metrics = RoundClock(), {}
    clock.mark()
    for t in range(1, cfg.algorithm.rounds + 1):
        theta = runner.round(theta, t)
        metrics = fed.evaluate(theta)
        clock.mark()
    return theta, metrics, clock, startup


def run_raysim(cfg: ExperimentConfig, workdir: Path) -> tuple[dict, RoundClock, dict, float]:
    """Run raysim (starting its own local Ray): (final metrics, clock marked after each round, run.json, first round s)."""
    import raysim

    clock = RoundClock()
    t0 = time.perf_counter()
    result = raysim.run(cfg, out=workdir / "raysim", on_round=clock.mark)
    last = result.rounds.iloc[-1]
    metrics = {k: float(last[k]) for k in ("test_accuracy", "test_loss", "train_loss")}
    return metrics, clock, result.info, clock.wall[0] - (t0 + result.info["startup_s"])


def measure(system: str, num_clients: int, per_round: int, rounds: int, seed: int, workdir: Path,
            launched: float) -> Measurement:
    """Run one system in this process (launched at epoch second `launched`) with the memory sampler
    on; writes the final parameters of a reference."""
    torch.set_num_threads(1)
    cfg = load_config(experiment(num_clients, rounds, seed, per_round))
    with PeakMemory(process_tree, interval=SAMPLE_EVERY_S) as sampler:
        if system == "raysim":
            metrics, clock, info, first = run_raysim(cfg, workdir)
            startup = info["startup_s"] - info["data_s"]  # Ray up, server and client actors ready
            parts = (info["ray_s"], info["actors_s"])
            wall, cpu = np.diff(clock.wall), np.diff(clock.cpu)  # rounds 2..
            begun = clock.epoch[0] - first
        else:
            theta, metrics, clock, startup = run_reference(system, cfg, workdir)
            parts = (0.0, 0.0)
            np.save(workdir / f"{system}.npy", theta.numpy())
            first = clock.wall[1] - clock.wall[0]
            wall, cpu = np.diff(clock.wall)[1:], np.diff(clock.cpu)[1:]
            begun = clock.epoch[0]
    return Measurement(system, num_clients, rounds, begun - launched, startup, *parts, first, float(np.median(wall)), float(np.mean(cpu)),
                       sampler.peak / 2**20, sampler.processes, metrics["test_accuracy"], metrics["test_loss"],
                       metrics["train_loss"])


def measure_in_subprocess(system: str, num_clients: int, per_round: int, rounds: int, seed: int, workdir: Path) -> Measurement:
    """`measure` in a fresh Python process, so start-up and memory are that system's alone."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"{system}.json"
    for attempt in range(1, ATTEMPTS + 1):
        cmd = [sys.executable, __file__, "--one", system, "--clients", str(num_clients), "--per-round", str(per_round),
               "--rounds", str(rounds), "--seed", str(seed), "--workdir", str(workdir), "--launched", repr(time.time())]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode == 0:
            break
        print(f"{system} at {num_clients} clients failed (attempt {attempt} of {ATTEMPTS}; on an overloaded machine"
              " Ray's raylet can miss its fixed 30 s registration deadline)", flush=True)
    else:
        raise RuntimeError(f"{system} at {num_clients} clients failed {ATTEMPTS} times; see its stderr above")
    return Measurement(**json.loads(out.read_text()))


def ratios(rows: list[Measurement]) -> list[dict]:
    """Per client count: raysim's round time against each reference, and the checks of the issue's targets."""
    by = {(m.system, m.clients): m for m in rows}
    out = []
    for n in sorted({m.clients for m in rows}):
        ray_, seq, vec = by[("raysim", n)], by[("sequential", n)], by[("vectorized", n)]
        out.append({
            "clients": n,
            "raysim/vectorized": ray_.round_s / vec.round_s,
            "sequential/raysim": seq.round_s / ray_.round_s,
            "sequential/vectorized": seq.round_s / vec.round_s,
            "cpu raysim/vectorized": ray_.cpu_round_s / vec.cpu_round_s,
            "cpu sequential/raysim": seq.cpu_round_s / ray_.cpu_round_s,
            "max |acc - raysim|": max(abs(seq.test_accuracy - ray_.test_accuracy), abs(vec.test_accuracy - ray_.test_accuracy)),
            "max |test_loss - raysim|": max(abs(seq.test_loss - ray_.test_loss), abs(vec.test_loss - ray_.test_loss)),
        })
    return out


def targets(rows: list[Measurement], table: list[dict]) -> list[tuple[str, str, bool]]:
    """The targets as (target, measured, met): ratios to the plain torch loop and to the vectorized limit, from this run."""
    by = {(m.system, m.clients): m for m in rows}
    out = []
    for r in table:
        n = r["clients"]
        ray_, seq = by[("raysim", n)], by[("sequential", n)]
        out.append((f"raysim round <= {TARGETS['round_vs_vectorized']}x vectorized at {n} clients",
                    f"{r['raysim/vectorized']:.2f}x", r["raysim/vectorized"] <= TARGETS["round_vs_vectorized"]))
        launch = ray_.launch_s / seq.launch_s
        out.append((f"raysim launch to round 1 <= {TARGETS['launch_vs_torch']}x the torch loop's at {n} clients",
                    f"{launch:.2f}x ({ray_.launch_s:.1f} s / {seq.launch_s:.1f} s)", launch <= TARGETS["launch_vs_torch"]))
        pss = ray_.peak_pss_mb / seq.peak_pss_mb
        out.append((f"raysim summed PSS <= {TARGETS['pss_vs_torch']}x the torch loop's at {n} clients",
                    f"{pss:.2f}x ({ray_.peak_pss_mb:.0f} MB / {seq.peak_pss_mb:.0f} MB)", pss <= TARGETS["pss_vs_torch"]))
    return out


def machine() -> str:
    """This machine in a line: CPU model, cores, memory, torch."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU") if Path("/proc/cpuinfo").exists() else "unknown CPU"
    return (f"{model}, {os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB, torch {torch.__version__},"
            " 1 torch thread per process")


def median_of(runs: list[Measurement]) -> Measurement:
    """One Measurement whose every number is the median over `runs` of the same system and size."""
    first = asdict(runs[0])
    return Measurement(**{k: (float(np.median([asdict(r)[k] for r in runs])) if isinstance(v, float) else v)
                          for k, v in first.items()})


def markdown(rows: list[Measurement], table: list[dict], checks: list[tuple[str, str, bool]], args: argparse.Namespace,
             load: list[float]) -> str:
    """The results page: the systems table, the ratios and the targets."""
    lines = [
        "# Speed: raysim against a sequential torch loop and the vectorized limit",
        "",
        f"FedAvg, MLP [64] float32 on digits, Dirichlet(0.5), {args.per_round} clients a round (all when fewer),"
        f" 1 local epoch, batch 10, lr 0.05, {args.rounds} rounds, evaluation every round, medians of {args.repeats}"
        f" run(s); `python benchmarks/speed.py`. {machine()}; the machine is shared,"
        " so seconds are noisy: compare ratios from one run. launch s: from the process's launch to round 1 begun"
        " (imports and data included); start-up s: Ray up and actors ready (raysim) or data read into tensors"
        " (references); round s: median of rounds 2.., first round apart;"
        " peak PSS: summed over the process and its descendants."
        f" Load average (1 min) at the start and end of the run: {load[0]:.1f}, {load[1]:.1f}.",
        "",
        "| system | clients | launch s | start-up s | first round s | round s | CPU s / round | peak PSS MB | processes |"
        " test acc | test loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in sorted(rows, key=lambda m: (m.clients, SYSTEMS.index(m.system))):
        lines.append(f"| {m.system} | {m.clients} | {m.launch_s:.2f} | {m.startup_s:.2f} | {m.first_round_s:.3f} | {m.round_s:.4f} |"
                     f" {m.cpu_round_s:.4f} | {m.peak_pss_mb:.0f} | {m.processes} | {m.test_accuracy:.4f} | {m.test_loss:.5f} |")
    lines += ["", "raysim's start-up in parts: " + ", ".join(
        f"{m.clients} clients: ray.init {m.ray_up_s:.2f} s, server up {m.startup_s - m.ray_up_s - m.actors_ready_s:.2f} s,"
        f" client actors ready {m.actors_ready_s:.2f} s" for m in rows if m.system == "raysim") + "."]
    lines += ["", "Ratios of real seconds per round (and of CPU seconds per round):", "",
              "| clients | raysim / vectorized | sequential / raysim | sequential / vectorized | CPU raysim / vectorized |"
              " CPU sequential / raysim | max abs acc diff | max abs test-loss diff |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['clients']} | {r['raysim/vectorized']:.2f} | {r['sequential/raysim']:.2f} |"
                     f" {r['sequential/vectorized']:.2f} | {r['cpu raysim/vectorized']:.2f} | {r['cpu sequential/raysim']:.2f} | {r['max |acc - raysim|']:.1e} | {r['max |test_loss - raysim|']:.1e} |")
    lines += ["", "| target | measured | met |", "|---|---:|:---:|"]
    lines += [f"| {name} | {value} | {'yes' if ok else 'NO'} |" for name, value, ok in checks]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--per-round", type=int, default=100, help="clients a round (all when fewer)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each system and size; figures are their medians")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        m = measure(args.one, args.clients[0], args.per_round, args.rounds, args.seed, args.workdir, args.launched)
        (args.workdir / f"{args.one}.json").write_text(json.dumps(asdict(m)))
        return
    if args.rounds < 2:
        ap.error("--rounds: at least 2 (round 1 is reported apart from the steady rounds)")
    rows: list[Measurement] = []
    load = [os.getloadavg()[0]]
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory(prefix="raysim-speed-") as tmp:
        for n in args.clients:
            for system in args.systems:
                m = median_of([measure_in_subprocess(system, n, args.per_round, args.rounds, args.seed, Path(tmp) / str(n))
                               for _ in range(args.repeats)])
                rows.append(m)
                print(f"{system:>10} {n:>5} clients: launch to round 1 {m.launch_s:.2f} s, round {m.round_s:.4f} s"
                      f" ({m.cpu_round_s:.4f} CPU s),"
                      f" peak PSS {m.peak_pss_mb:.0f} MB, test acc {m.test_accuracy:.4f}", flush=True)
            seq, vec = (Path(tmp) / str(n) / f"{s}.npy" for s in ("sequential", "vectorized"))
            if seq.exists() and vec.exists():
                diff = float(np.abs(np.load(seq) - np.load(vec)).max())
                print(f"{'':>10} {n:>5} clients: max |params sequential - vectorized| = {diff:.1e}", flush=True)
                assert diff < MATCH_TOL, f"references disagree at {n} clients: {diff:.1e}"
    load.append(os.getloadavg()[0])
    if set(args.systems) != set(SYSTEMS):
        return
    table = ratios(rows)
    checks = targets(rows, table)
    text = markdown(rows, table, checks, args, load)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed.md").write_text(text)
    pd.DataFrame([asdict(m) for m in rows]).to_parquet(args.out / "speed.parquet", index=False)
    worst = max(r["max |acc - raysim|"] for r in table)
    print(f"final test accuracy: references - raysim at most {worst:.1e} (tolerance {MATCH_TOL:g})")
    assert worst <= MATCH_TOL, f"final test accuracy differs from raysim's by {worst:.1e} (> {MATCH_TOL:g})"


if __name__ == "__main__":
    main()
