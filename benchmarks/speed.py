"""Speed of raysim against the physical limit: FedAvg, MLP on digits, Dirichlet(0.5), as a user runs it.

Four systems run the same computation with the same seeds: raysim (Ray, client actors, each
shard's clients at once), a plain single-process torch loop over the clients (`sequential`), that
loop vectorized with torch.func over the round's clients (`vectorized`, issue 17's limit), and the
vectorized loop with raysim's own per-step kernel in place of torch.func (`stacked`,
raysim/training/stacked.py: the same numbers bit for bit; what one process does with the kernel raysim's
shards use). A round selects `--per-round` clients (default 100, or all when fewer), the same ones in
every system (FedAvg's own plan); each runs 1 local epoch of minibatches of 10 at lr 0.05, drawn by
the fedavg family's own `batch_plan` from the stream (seed, round, client, "step"), and every
round ends with the server's evaluation. Each (system, clients) runs in a fresh process, so
start-up and memory are its own: start-up is from the process's launch to the first round begun
(imports and data included, as a user waits for them); peak memory is the PSS summed over that
process and all its descendants (Ray's processes for raysim), sampled by a background thread.
With `--repeats R` every figure is the median of R runs.

With `--flower PYTHON` (what `make bench-peers` passes: the python of `.venv-flower`, where Flower and its
own Ray live apart from raysim's) Flower's Simulation Engine runs the same task as another system
(benchmarks/flower_peer.py), and with `--pfl PYTHON` (the python of `.venv-pfl`) so does Apple's pfl-research
(benchmarks/pfl_peer.py, two worker processes under torchrun): raysim's split, initial weights, selected
clients and minibatches are exported to a file each reads (`peer_task`), so their accuracy must agree with
raysim's; a peer's start-up is from its own process's launch and its memory the PSS of its process tree
(Ray's daemons and ClientApp workers for Flower, torchrun's agent and workers for pfl). The peer table of
issues 17 and 30 is then printed and written to results/peers.md.

Run: python benchmarks/speed.py [--clients 10 100 1000] [--per-round 100] [--rounds 20] [--repeats 3] [--flower PY] [--pfl PY]
"""
from __future__ import annotations

import argparse
import importlib.util
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
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

from raysim.callbacks import Callback
from raysim.config import ExperimentConfig, load_config
from raysim.contract import EvalData
from raysim.core.keys import Keys
from raysim.core.memory import PeakMemory
from raysim.core.rng import SERVER, SETUP, stream
from raysim.data import build_federated, read_clients, read_table_arrays
from raysim.models import DTYPES, ParamSpec, build_model
from raysim.round.experiment import make_algorithm
from raysim.training import LocalSGD, ServerState, batch_plan, batch_plans
from raysim.training.local_sgd import sample_losses

SYSTEMS = ("raysim", "flower", "pfl", "sequential", "vectorized", "stacked")
BASE_SYSTEMS = ("raysim", "sequential", "vectorized", "stacked")  # what runs without --flower and --pfl
PEERS = {"flower": "Flower", "pfl": "pfl"}  # systems run in a child process under another python, and their names
STEP_PURPOSE = "step"  # the stream a shard hands the client step (raysim/round/shard.py, ClientShard._steps)
PLAIN_FEDAVG = {"server_lr": 1.0, "weighting": "samples", "theta0": "model_init", "loss": "ce", "l2": 0.0,
                "lr_schedule": "constant", "quantizer": "none"}  # what the references implement
SAMPLE_EVERY_S = 0.5
ATTEMPTS = 3
MATCH_TOL = 1e-5
TARGETS = {"round_vs_vectorized": 1.3, "launch_vs_torch": 2.0, "pss_vs_torch": 2.5}  # issue 17
FLOWER_SCRIPT = Path(__file__).with_name("flower_peer.py")
FLOWER_ENV = {"FLWR_TELEMETRY_ENABLED": "0"}  # Flower otherwise posts usage events to its servers
PFL_SCRIPT = Path(__file__).with_name("pfl_peer.py")
# pfl's processes (torchrun, a torch thread each): on 2 cores, 1.5x one's pace at 10 clients, 2x at 10^4 a round; 3 are slower
PFL_WORKERS = 2
PFL_ENV = {"PFL_PYTORCH_DEVICE": "cpu"}  # pfl's documented override of its default device
PEER_ACC_TOL = 1 / 359  # one of the 359 test samples of digits: the peers sum the clients' weights in their own order


def load_flower_peer():
    """benchmarks/flower_peer.py as a module (numpy and torch only; Flower is imported inside its main)."""
    if "flower_peer" not in sys.modules:
        spec = importlib.util.spec_from_file_location("flower_peer", FLOWER_SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["flower_peer"]


def pfl_command(python: str, task: Path, workers: int = PFL_WORKERS) -> list[str]:
    """How pfl's documentation runs a PyTorch simulation on `workers` processes of one machine: `torchrun --standalone
    --nnodes=1 --nproc_per_node=N train.py` (one process is plain `python train.py`)."""
    if workers == 1:
        return [python, str(PFL_SCRIPT), str(task)]
    return [python, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", f"--nproc_per_node={workers}",
            str(PFL_SCRIPT), str(task)]


def check_plain_fedavg(algo: LocalSGD) -> None:
    """Raise unless `algo` is the plain FedAvg the references and peers implement (PLAIN_FEDAVG, mu 0)."""
    unlike = {k: v for k, v in PLAIN_FEDAVG.items() if getattr(algo.params, k) != v}
    if unlike or algo.mu != 0.0:
        raise ValueError(f"the references and peers implement plain FedAvg ({PLAIN_FEDAVG}, mu 0); config differs: {unlike}")


def peer_task(cfg: ExperimentConfig, data_dir: Path):
    """The task as a peer reads it (flower_peer.Task), built in `data_dir` as raysim builds it: the pooled training
    rows and each client's row indices (its split), the test set, the initial weights, every round's clients (FedAvg's
    plan) with their minibatches (the shards' keyed batch plans, -1 pads) and the server's evaluation schedule and
    training-loss sample (raysim.round.engine.eval_data's)."""
    fed = build_federated(cfg.data, cfg.seed, data_dir)
    algo = make_algorithm(cfg, fed)
    check_plain_fedavg(algo)
    dtype = DTYPES[cfg.model.dtype]
    spec = ParamSpec.of(build_model(cfg.model, fed.feature_shape, fed.image_shape, fed.num_classes))
    x, y = read_table_arrays(fed.train_path)
    tx, ty = read_table_arrays(fed.test_path)
    client_id = pq.read_table(fed.train_path, columns=["client_id"]).column("client_id").to_numpy()
    order = np.argsort(client_id, kind="stable")
    client_rows = np.split(order, np.cumsum(np.bincount(client_id, minlength=fed.num_clients))[:-1])
    n = len(y)
    eval_rows = np.arange(n) if n <= cfg.eval.train_samples else \
        np.sort(stream(cfg.seed, SETUP, SERVER, "eval_train").choice(n, cfg.eval.train_samples, replace=False))
    state, p, sizes = algo.init(), algo.params, np.asarray(fed.client_sizes)
    selected, batches = [], []
    for t in range(1, cfg.algorithm.rounds + 1):
        chosen = np.asarray(algo.plan(state, t, stream(cfg.seed, t, SERVER, "plan")).clients)
        keys = Keys(cfg.seed, t, chosen, STEP_PURPOSE)
        plan = batch_plans(sizes[chosen], p.batch_size, p.local_steps, p.local_epochs, keys)
        selected.append(chosen)
        batches.append(np.where(plan.w > 0, plan.idx, -1))
    init = spec.unflatten(torch.tensor(state.params, dtype=dtype))
    as_model = np.dtype(cfg.model.dtype)
    return load_flower_peer().Task(
        train_x=x.astype(as_model), train_y=y.astype(np.int64), client_rows=client_rows,
        test_x=tx.astype(as_model), test_y=ty.astype(np.int64), names=list(spec.names),
        init=[v.numpy() for v in init.values()], lr=float(p.lr), selected=selected, batches=batches,
        eval_rows=eval_rows, eval_every=cfg.eval.every)


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
    """User + system CPU seconds used so far by this process and its descendants, those that have exited and been
    waited for included (a peer's workers exit right after their last round's event)."""
    total = 0.0
    for p in process_tree():
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


class Federation:
    """The references' in-process copy of the experiment: the same split, initial model and evaluation as raysim."""

    def __init__(self, cfg: ExperimentConfig, data_dir: Path):
        t0 = time.perf_counter()
        fed = build_federated(cfg.data, cfg.seed, data_dir)
        self.data_s = time.perf_counter() - t0
        self.cfg = cfg
        self.data = fed
        self.algo = make_algorithm(cfg, fed)
        check_plain_fedavg(self.algo)
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

    def grads(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Every client's minibatch gradient [k, d]."""
        return self.fed.spec.flatten(self.vgrad(self.fed.spec.unflatten(theta), x, y, w))

    def _loss(self, params: dict, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the real samples of a minibatch (w = 0 marks padding), by raysim's own per-sample
        losses (a cross-entropy of labels reduced along the transposed logits: F.cross_entropy's differ in the last bit)."""
        ce = sample_losses(functional_call(self.fed.module, params, (x,)), y, "ce")
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
            g = self.grads(theta, self.xs[rows, idx[:, s]], self.ys[rows, idx[:, s]], w[:, s])
            theta = theta - lr * active[:, s] * g
        return theta_g + (sizes / sizes.sum() * (theta - theta_g)).sum(0)


class Stacked(Vectorized):
    """The vectorized loop with raysim's own per-step kernel (raysim/training/stacked.py) in place of torch.func: what
    one process does with the kernel raysim's shards use (the same numbers, bit for bit)."""

    def grads(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return self.fed.algo.batch_grads(theta, x, y, w)


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
    server_up_s: float  # raysim's start-up less the two above: the engine built (a median of each run's own difference)
    first_round_s: float
    round_s: float
    cpu_round_s: float
    peak_pss_mb: float
    processes: int
    test_accuracy: float
    test_loss: float
    train_loss: float

    @property
    def ready_s(self) -> float:
        """From the launch to round 1 done, less a steady round: every one-time cost, including those that
        fall into round 1 (Flower starts Ray and its workers while round 1 is under way; vmap's first trace)."""
        return self.launch_s + self.first_round_s - self.round_s


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

    def mark_at(self, epoch: float) -> None:
        """A mark another process timed (at epoch second `epoch`); CPU seconds are read now."""
        self.wall.append(epoch)
        self.epoch.append(epoch)
        self.cpu.append(tree_cpu_seconds())


def run_reference(system: str, cfg: ExperimentConfig, workdir: Path) -> tuple[torch.Tensor, dict, RoundClock, float]:
    """Run a reference for cfg's rounds: (final parameters, final metrics, clock marked before and after each round, start-up s)."""
    t0 = time.perf_counter()
    fed = Federation(cfg, workdir / "data")
    runner = {"sequential": Sequential, "vectorized": Vectorized, "stacked": Stacked}[system](fed)
    theta = torch.tensor(fed.algo.init().params, dtype=fed.dtype)
    startup = time.perf_counter() - t0 - fed.data_s
    clock, metrics = RoundClock(), {}
    clock.mark()
    for t in range(1, cfg.algorithm.rounds + 1):
        theta = runner.round(theta, t)
        metrics = fed.evaluate(theta)
        clock.mark()
    return theta, metrics, clock, startup


class RoundOneBegun(Callback):
    """When raysim's round 1 begins (`on_run_start`): its start-up done, Ray, the data, the actors and every import
    the run made on the way (the runner's own, `import ray` among them, come in at the first `raysim.run`)."""

    def __init__(self):
        self.wall = 0.0

    def on_run_start(self, run) -> None:
        self.wall = time.perf_counter()


def run_raysim(cfg: ExperimentConfig, workdir: Path) -> tuple[dict, RoundClock, dict, float]:
    """Run raysim (starting its own local Ray) into a fresh run directory under `workdir` (raysim never overwrites a
    run, and `--repeats` measures it again there): (final metrics, clock marked after each round, run.json, first
    round s: from round 1 begun to its end)."""
    import raysim

    clock, begun = RoundClock(), RoundOneBegun()
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="raysim-", dir=workdir)) / "run"
    result = raysim.run(cfg, out=out, on_round=clock.mark, callbacks=[begun], progress=False)
    last = result.rounds.iloc[-1]
    metrics = {k: float(last[k]) for k in ("test_accuracy", "test_loss", "train_loss")}
    return metrics, clock, result.info, clock.wall[0] - begun.wall


def run_peer(system: str, python: str, cfg: ExperimentConfig, workdir: Path) -> tuple[dict, RoundClock, float, float, PeakMemory]:
    """Export the task, then run the peer's script (benchmarks/flower_peer.py or pfl_peer.py) under `python` with
    the memory sampler on its process tree: (final metrics, clock marked at round 1 begun and after each round,
    launch epoch second, epoch second of its task read, sampler)."""
    task = workdir / f"{system}-task.npz"
    load_flower_peer().write_task(task, peer_task(cfg, workdir / "data"))
    return run_peer_task(system, python, task, cfg.algorithm.rounds, workdir / f"{system}.log")


def run_peer_task(system: str, python: str, task: Path, rounds: int, log: Path) -> tuple[dict, RoundClock, float, float, PeakMemory]:
    """Run a peer on an exported task of `rounds` rounds, reading its event lines (see `run_peer`)."""
    cmd, env = ([python, str(FLOWER_SCRIPT), str(task)], FLOWER_ENV) if system == "flower" else (pfl_command(python, task), PFL_ENV)
    clock, metrics, ready = RoundClock(), {}, None
    with open(log, "w") as err:
        launched = time.time()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **env})
        root = psutil.Process(proc.pid)

        def tree() -> list[psutil.Process]:
            try:
                return [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return []

        with PeakMemory(tree, interval=SAMPLE_EVERY_S) as sampler:
            prefix = load_flower_peer().EVENT_PREFIX
            for line in proc.stdout:
                if not line.startswith(prefix):
                    continue
                event = json.loads(line[len(prefix):])
                if event["event"] == "ready":
                    ready = event["t"]
                    continue
                clock.mark_at(event["t"])
                if "test_accuracy" in event:
                    metrics = event
            code = proc.wait()
    if code != 0 or len(clock.wall) != rounds + 1:
        raise RuntimeError(f"{PEERS[system]} exited with status {code} after {len(clock.wall)} events; its log: {log}\n"
                           + "\n".join(log.read_text().splitlines()[-20:]))
    return metrics, clock, launched, ready, sampler


def measure(system: str, num_clients: int, per_round: int, rounds: int, seed: int, workdir: Path,
            launched: float, peers: dict[str, str] | None = None) -> Measurement:
    """Run one system in this process (launched at epoch second `launched`) with the memory sampler
    on; writes the final parameters of a reference. A peer (Flower, pfl) runs in a child process under
    its python in `peers`, launched and measured here."""
    torch.set_num_threads(1)
    cfg = load_config(experiment(num_clients, rounds, seed, per_round))
    if system in PEERS:
        metrics, clock, launched, ready, sampler = run_peer(system, (peers or {})[system], cfg, workdir)
        wall, cpu = np.diff(clock.wall)[1:], np.diff(clock.cpu)[1:]
        steady = float(np.median(wall))  # Flower starts Ray and its workers while round 1 is under way:
        startup = clock.epoch[1] - steady - ready  # a peer's start-up is round 1's excess over a steady round
        return Measurement(system, num_clients, rounds, clock.epoch[0] - launched, startup, 0.0, 0.0, 0.0,
                           clock.wall[1] - clock.wall[0], steady, float(np.mean(cpu)),
                           sampler.peak / 2**20, sampler.processes, metrics["test_accuracy"], metrics["test_loss"],
                           metrics["train_loss"])
    with PeakMemory(process_tree, interval=SAMPLE_EVERY_S) as sampler:
        if system == "raysim":
            metrics, clock, info, first = run_raysim(cfg, workdir)
            startup = info["startup_s"] - info["data_s"]  # Ray up, server and client actors ready
            parts = (info["ray_s"], info["actors_s"], startup - info["ray_s"] - info["actors_s"])
            wall, cpu = np.diff(clock.wall), np.diff(clock.cpu)  # rounds 2..
            begun = clock.epoch[0] - first
        else:
            theta, metrics, clock, startup = run_reference(system, cfg, workdir)
            parts = (0.0, 0.0, 0.0)
            np.save(workdir / f"{system}.npy", theta.numpy())
            first = clock.wall[1] - clock.wall[0]
            wall, cpu = np.diff(clock.wall)[1:], np.diff(clock.cpu)[1:]
            begun = clock.epoch[0]
    return Measurement(system, num_clients, rounds, begun - launched, startup, *parts, first, float(np.median(wall)), float(np.mean(cpu)),
                       sampler.peak / 2**20, sampler.processes, metrics["test_accuracy"], metrics["test_loss"],
                       metrics["train_loss"])


def measure_in_subprocess(system: str, num_clients: int, per_round: int, rounds: int, seed: int, workdir: Path,
                          peers: dict[str, str] | None = None) -> Measurement:
    """`measure` in a fresh Python process, so start-up and memory are that system's alone."""
    workdir.mkdir(parents=True, exist_ok=True)
    out = workdir / f"{system}.json"
    for attempt in range(1, ATTEMPTS + 1):
        cmd = [sys.executable, __file__, "--one", system, "--clients", str(num_clients), "--per-round", str(per_round),
               "--rounds", str(rounds), "--seed", str(seed), "--workdir", str(workdir), "--launched", repr(time.time()),
               *[a for peer, python in (peers or {}).items() for a in (f"--{peer}", python)]]
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
        ray_, seq, vec, stk = (by[(s, n)] for s in ("raysim", "sequential", "vectorized", "stacked"))
        out.append({
            "clients": n,
            "raysim/vectorized": ray_.round_s / vec.round_s,
            "raysim/stacked": ray_.round_s / stk.round_s,
            "sequential/raysim": seq.round_s / ray_.round_s,
            "sequential/vectorized": seq.round_s / vec.round_s,
            "cpu raysim/vectorized": ray_.cpu_round_s / vec.cpu_round_s,
            "cpu sequential/raysim": seq.cpu_round_s / ray_.cpu_round_s,
            "max |acc - raysim|": max(abs(m.test_accuracy - ray_.test_accuracy) for m in (seq, vec, stk)),
            "max |test_loss - raysim|": max(abs(m.test_loss - ray_.test_loss) for m in (seq, vec, stk)),
        })
    return out


def peer_table(rows: list[Measurement], per_round: int) -> list[str]:
    """Issues 17 and 30's table from this run: per client count, seconds per steady round, start-up (`ready_s`), summed
    PSS and final test accuracy of raysim, the peers that ran (Flower, pfl), the torch loop and the limit, with
    their ratios (a peer's round against raysim's: how many times raysim's round it takes)."""
    by = {(m.system, m.clients): m for m in rows}
    peers = [p for p in PEERS if any(m.system == p for m in rows)]
    names = [PEERS[p] for p in peers]
    both = ", ".join(["raysim", *names])
    lines = [
        f"| clients (per round) | s/round raysim | {' | '.join(names)} | torch | limit | raysim / limit |"
        f" {' | '.join(f'{name} / raysim' for name in names)} | start-up s {' / '.join(['raysim', *names, 'torch'])} |"
        f" start-up / torch: {both} | summed PSS MB {' / '.join(['raysim', *names, 'torch'])} | PSS / torch: {both} |"
        f" test acc {' / '.join(['raysim', *names, 'torch', 'limit'])} |",
        "|---|" + "---:|" * (9 + 2 * len(peers)),
    ]
    for n in sorted({m.clients for m in rows}):
        r, t, v = (by[(s, n)] for s in ("raysim", "sequential", "vectorized"))
        own = [by[(p, n)] for p in peers]
        lines.append(
            f"| {n} ({min(per_round, n)}) | {r.round_s:.3f} | {' | '.join(f'{m.round_s:.3f}' for m in own)} | {t.round_s:.3f} |"
            f" {v.round_s:.3f} | {r.round_s / v.round_s:.2f}x | {' | '.join(f'{m.round_s / r.round_s:.1f}x' for m in own)} |"
            f" {' / '.join(f'{m.ready_s:.1f}' for m in (r, *own, t))} | {', '.join(f'{m.ready_s / t.ready_s:.2f}x' for m in (r, *own))} |"
            f" {' / '.join(f'{m.peak_pss_mb:.0f}' for m in (r, *own, t))} |"
            f" {', '.join(f'{m.peak_pss_mb / t.peak_pss_mb:.2f}x' for m in (r, *own))} |"
            f" {' / '.join(f'{m.test_accuracy:.4f}' for m in (r, *own, t, v))} |")
    return lines


def peer_gap(rows: list[Measurement], peer: str) -> tuple[float, float]:
    """The largest |peer - raysim| over client counts of final test accuracy and of test loss."""
    by = {(m.system, m.clients): m for m in rows}
    pairs = [(by[(peer, n)], by[("raysim", n)]) for n in {m.clients for m in rows}]
    return (max(abs(f.test_accuracy - r.test_accuracy) for f, r in pairs),
            max(abs(f.test_loss - r.test_loss) for f, r in pairs))


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


def versions(python: str, *packages: str) -> str:
    """The versions of `packages` in the environment of `python`, as "name version, ..."."""
    code = f"from importlib.metadata import version as v; print(', '.join(f'{{p}} {{v(p)}}' for p in {list(packages)!r}))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def median_of(runs: list[Measurement]) -> Measurement:
    """One Measurement whose every number is the median over `runs` of the same system and size."""
    first = asdict(runs[0])
    return Measurement(**{k: (float(np.median([asdict(r)[k] for r in runs])) if isinstance(v, float) else v)
                          for k, v in first.items()})


def markdown(rows: list[Measurement], table: list[dict], checks: list[tuple[str, str, bool]], args: argparse.Namespace,
             load: list[float]) -> str:
    """The results page: with a peer (Flower, pfl), the peer table of issues 17 and 30 first; then the systems table,
    the ratios and the targets."""
    peers = [p for p in PEERS if any(m.system == p for m in rows)]
    lines = [
        f"# Peers: raysim against {', '.join(PEERS[p] for p in peers)}, a sequential torch loop and the vectorized limit"
        if peers else "# Speed: raysim against a sequential torch loop and the vectorized limit",
        "",
        f"FedAvg, MLP [64] float32 on digits, Dirichlet(0.5), {args.per_round} clients a round (all when fewer),"
        f" 1 local epoch, batch 10, lr 0.05, {args.rounds} rounds, evaluation every round, medians of {args.repeats}"
        f" run(s); `{'make bench-peers' if peers else 'python benchmarks/speed.py'}`. {machine()}; the machine is shared,"
        " so seconds are noisy: compare ratios from one run. launch s: from the process's launch to round 1 begun"
        " (imports and data included); start-up s: Ray up and actors ready (raysim), data read into tensors"
        " (references), or from its task read to round 1 done, less a steady round (a peer: Flower starts Ray and"
        " its workers while round 1 is under way); round s: median of rounds 2.., first round apart;"
        " peak PSS: summed over the process and its descendants."
        f" Load average (1 min) at the start and end of the run: {load[0]:.1f}, {load[1]:.1f}.",
        "",
    ]
    if "flower" in peers:
        acc, loss = peer_gap(rows, "flower")
        lines += [
            f"Flower ({versions(args.flower, 'flwr', 'ray')}) runs its Simulation Engine (`run_simulation`, Ray backend,"
            f" {load_flower_peer().RAY_CPUS} CPUs, {load_flower_peer().CLIENT_CPUS} CPU per ClientApp: two ClientApp"
            " workers, as raysim runs two client actors; one supernode per client; telemetry off) on the task raysim"
            " exports: its split (each client's rows), initial weights, each round's clients (FedAvg's plan, sent by"
            " a configure_train that names the client in the message) and each client's minibatches in raysim's"
            " order, trained with torch.optim.SGD; Flower's own FedAvg aggregates. Its launch reads the exported"
            " arrays instead of building the data. Flower begins round 1 before Ray and its ClientApp workers are"
            " up, so start-up here is, for every system, from the launch to round 1 done, less a steady round (the"
            " systems table below has launch to round 1 begun and the first round apart). Flower's PSS is summed"
            " over its process tree (Ray's daemons and workers included)."
            f" Final test accuracy Flower - raysim: at most {acc:.1e} (tolerance {PEER_ACC_TOL:.1e}, one test"
            f" sample; Flower sums the clients' float32 weights in reply order); test loss at most {loss:.1e}.",
            "",
        ]
    if "pfl" in peers:
        acc, loss = peer_gap(rows, "pfl")
        lines += [
            f"pfl ({versions(args.pfl, 'pfl', 'torch')}) runs its own simulation (benchmarks/pfl_peer.py) in its"
            f" fastest documented CPU configuration here: {PFL_WORKERS} worker processes started by `torchrun"
            " --standalone --nnodes=1`, as its guide to fast distributed simulations has PyTorch users do, with as"
            " many processes as speed up (here 2: one is slower, and so are 3), the cohort shared out among them"
            " by data size and central evaluation sharded; one torch thread each; in-memory datasets (its fastest"
            " kind); whole-set central evaluation batches. It trains raysim's exported task: `FederatedAveraging`"
            " over a `SimulatedBackend` weighting by data points, each round's cohort the clients raysim selects,"
            " each client's dataset iterating its rows in raysim's minibatches (one local epoch is exactly them)"
            " and as long as its sample count, local torch.optim.SGD at lr 0.05 and a central SGD at rate 1.0 on"
            " the averaged update; the server evaluates after every round (pfl's CentralEvaluationCallback on"
            " raysim's schedule). As pfl always does, round 1 also evaluates each client before and after its"
            " training. Its PSS is summed over torchrun's agent, its workers and their cohort samplers."
            f" Final test accuracy pfl - raysim: at most {acc:.1e} (tolerance {PEER_ACC_TOL:.1e}, one test"
            f" sample; pfl sums the clients' float32 updates per worker, then across workers); test loss at most"
            f" {loss:.1e}.",
            "",
        ]
    if peers:
        lines += [*peer_table(rows, args.per_round), ""]
    lines += [
        "| system | clients | launch s | start-up s | first round s | round s | CPU s / round | peak PSS MB | processes |"
        " test acc | test loss |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in sorted(rows, key=lambda m: (m.clients, SYSTEMS.index(m.system))):
        lines.append(f"| {m.system} | {m.clients} | {m.launch_s:.2f} | {m.startup_s:.2f} | {m.first_round_s:.3f} | {m.round_s:.4f} |"
                     f" {m.cpu_round_s:.4f} | {m.peak_pss_mb:.0f} | {m.processes} | {m.test_accuracy:.4f} | {m.test_loss:.5f} |")
    lines += ["", "raysim's start-up in parts: " + ", ".join(
        f"{m.clients} clients: ray.init {m.ray_up_s:.2f} s, server up {m.server_up_s:.2f} s,"
        f" client shards ready {m.actors_ready_s:.2f} s" for m in rows if m.system == "raysim") + "."]
    lines += ["", "Ratios of real seconds per round (and of CPU seconds per round):", "",
              "| clients | raysim / vectorized | raysim / stacked | sequential / raysim | sequential / vectorized |"
              " CPU raysim / vectorized | CPU sequential / raysim | max abs acc diff | max abs test-loss diff |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in table:
        lines.append(f"| {r['clients']} | {r['raysim/vectorized']:.2f} | {r['raysim/stacked']:.2f} | {r['sequential/raysim']:.2f} |"
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
    ap.add_argument("--systems", nargs="+", choices=SYSTEMS,
                    help="default: raysim, sequential, vectorized and stacked, flower with --flower and pfl with --pfl")
    ap.add_argument("--flower", help="python of the virtual environment with Flower (make bench-peers builds .venv-flower)")
    ap.add_argument("--pfl", help="python of the virtual environment with pfl (make bench-peers builds .venv-pfl)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--one", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--launched", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    peers = {p: getattr(args, p) for p in PEERS if getattr(args, p)}
    if args.systems is None:
        args.systems = [s for s in SYSTEMS if s in BASE_SYSTEMS or s in peers]
    for p in set(PEERS) & set(args.systems) - set(peers):
        ap.error(f"--systems {p} needs --{p} PYTHON (make bench-peers builds .venv-{p})")
    if args.one:
        m = measure(args.one, args.clients[0], args.per_round, args.rounds, args.seed, args.workdir, args.launched, peers)
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
                m = median_of([measure_in_subprocess(system, n, args.per_round, args.rounds, args.seed, Path(tmp) / str(n),
                                                     peers) for _ in range(args.repeats)])
                rows.append(m)
                print(f"{system:>10} {n:>5} clients: launch to round 1 {m.launch_s:.2f} s, round {m.round_s:.4f} s"
                      f" ({m.cpu_round_s:.4f} CPU s),"
                      f" peak PSS {m.peak_pss_mb:.0f} MB, test acc {m.test_accuracy:.4f}", flush=True)
            seq, vec, stk = (Path(tmp) / str(n) / f"{s}.npy" for s in ("sequential", "vectorized", "stacked"))
            if seq.exists() and vec.exists():
                diff = float(np.abs(np.load(seq) - np.load(vec)).max())
                print(f"{'':>10} {n:>5} clients: max |params sequential - vectorized| = {diff:.1e}", flush=True)
                assert diff < MATCH_TOL, f"references disagree at {n} clients: {diff:.1e}"
            if vec.exists() and stk.exists():
                assert np.array_equal(np.load(vec), np.load(stk)), f"the stacked kernel is not vmap's, bit for bit, at {n} clients"
    load.append(os.getloadavg()[0])
    if not set(BASE_SYSTEMS) <= set(args.systems):
        return
    table = ratios(rows)
    checks = targets(rows, table)
    text = markdown(rows, table, checks, args, load)
    print(text)
    name = "peers" if set(PEERS) & set(args.systems) else "speed"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.md").write_text(text)
    pd.DataFrame([asdict(m) for m in rows]).to_parquet(args.out / f"{name}.parquet", index=False)
    worst = max(r["max |acc - raysim|"] for r in table)
    print(f"final test accuracy: references - raysim at most {worst:.1e} (tolerance {MATCH_TOL:g})")
    assert worst <= MATCH_TOL, f"final test accuracy differs from raysim's by {worst:.1e} (> {MATCH_TOL:g})"
    for p in PEERS:
        if p in args.systems:
            acc, loss = peer_gap(rows, p)
            print(f"final test accuracy: {PEERS[p]} - raysim at most {acc:.1e} (tolerance {PEER_ACC_TOL:.1e}); test loss {loss:.1e}")
            assert acc <= PEER_ACC_TOL, f"{PEERS[p]}'s final test accuracy differs from raysim's by {acc:.1e} (> {PEER_ACC_TOL:.1e})"


if __name__ == "__main__":
    main()
