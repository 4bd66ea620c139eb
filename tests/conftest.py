"""Shared fixtures: one local Ray for the whole session, started by the tests themselves."""
import re
from dataclasses import dataclass

import numpy as np
import pytest
import ray
import torch
from ray._private.internal_api import memory_summary

from raysim import register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.contract import ClientData, Context
from raysim.core.rng import SERVER, stream
from raysim.models import ModelConfig
from raysim.runner import ray_session
from raysim.training import ServerState

STRAGGLERS = {  # 12 digits clients, 8 a round, 4 local steps: compute times 4 + Erlang(4) in batch units
    "name": "stragglers",
    "seed": 11,
    "data": {"source": "digits", "num_clients": 12},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg_counting", "rounds": 5, "clients_per_round": 8, "lr": 0.1,
                  "local_steps": 4, "batch_size": 5, "weighting": "uniform"},
    "system": {"compute": {"unit": "batch"}, "comm": {"phi": 2.0}},
    "cluster": {"num_actors": 2},
}


def object_store() -> tuple[int, int]:
    """(MiB, objects) in Ray's object store, as `ray memory --stats-only` reports them."""
    mib, objects = re.search(r"Plasma memory usage (\d+) MiB, (\d+) objects", memory_summary(ray.get_runtime_context().gcs_address, stats_only=True)).groups()
    return int(mib), int(objects)


@pytest.fixture(scope="session")
def ray_cluster():
    """A real local Ray (2 CPUs, no dashboard), shut down at the end of the session."""
    ray_session.ensure(None, num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture
def one_torch_thread():
    """One torch thread: small matrices on a shared 2-core machine slow down 30x with two."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def sec51_problem():
    """The kernel paper's Sec. 6.1 set-up at seed 0: default_rng(0) draws theta* [d], then the X_i [n, d], then the
    noise (sigma 0.5); M=25 clients, n_i=500, d=100, eta=0.1. Returns (theta_star, X, ys, eta)."""
    rng = np.random.default_rng(0)
    M, d, n = 25, 100, 500
    theta_star = rng.normal(size=d)
    X = [rng.normal(size=(n, d)) for _ in range(M)]
    ys = [x @ theta_star + 0.5 * rng.normal(size=n) for x in X]
    return theta_star, X, ys, 0.1


def zo_algorithm(cls, num_clients=5, seed=0, per_round=None, **params):
    """A zeroth-order algorithm of `cls` for `num_clients` black-box clients (no data: the objective is synthetic)."""
    ctx = Context(seed=seed, rounds=1, clients_per_round=per_round or num_clients, num_clients=num_clients,
                  client_sizes=np.ones(num_clients), feature_shape=(1,), image_shape=None, num_classes=1,
                  model=ModelConfig(), params=cls.Params(**params))
    return cls(ctx)


def zo_round(algo, state, cstates, t):
    """One raysim round (one phase) in process: (new state, the clients' costs, the phase, the server's cost)."""
    plan = algo.plan(state, t, stream(algo.ctx.seed, t, SERVER, "plan"))
    replies, costs = [], []
    for c in plan.clients.tolist():
        reply, cstates[c], cost = algo.step(cstates[c], ClientData(c, None, None), plan.broadcast,
                                            stream(algo.ctx.seed, t, c, "step"))
        replies.append(reply)
        costs.append(cost)
    state, server_cost = algo.aggregate(state, replies, None)
    return state, costs, plan.phase, server_cost


def zo_drive(algo, rounds):
    """Run `rounds` raysim rounds (phases) as the server would: [(state, phase, costs, server cost)] per round."""
    cstates = {c: algo.client_init(c) for c in range(algo.ctx.num_clients)}
    state, history = algo.init(), []
    for t in range(1, rounds + 1):
        state, costs, phase, server_cost = zo_round(algo, state, cstates, t)
        history.append((state, phase, costs, server_cost))
    return history


@pytest.fixture
def driver():
    """(make, drive) of the zeroth-order tests: build a ZO algorithm without Ray and drive its rounds in process."""
    return zo_algorithm, zo_drive


@pytest.fixture
def one_round():
    """`zo_round`: one in-process round of a ZO algorithm."""
    return zo_round


@dataclass
class CountingState(ServerState):
    aggregated: float = 0.0


@register_algorithm("fedavg_counting")
class FedAvgCounting(FedAvg):
    """FedAvg that reports how many client replies (uniform weight 1 each) it aggregated."""

    def init(self):
        return CountingState(super().init().params)

    def aggregate(self, state, replies, rng):
        new, cost = super().aggregate(state, replies, rng)
        return CountingState(new.params, float(sum(r.weight for r in replies))), cost

    def evaluate(self, state, data):
        return {**super().evaluate(state, data), "aggregated": state.aggregated}




def write_run(run_dir, rounds=150, name="synthetic", speed=1.0, metrics=("test_accuracy", "test_loss"), seed=0):
    """A run directory written with raysim's results writers, without training: `rounds` rounds of 8 selected
    clients (6 kept, one dropped at the deadline, one late with no finish time), `metrics` every 10 rounds and at
    the last (test_accuracy and test_loss as learning curves that `speed` scales, any other name = the round)."""
    import yaml

    from raysim.storage.atomic import write_parquet, write_text

    rng = np.random.default_rng(seed)
    rows, sim_time = [], 0.0
    for r in range(1, rounds + 1):
        finish = 1.0 + rng.exponential(size=8)
        finish[6] = finish[:6].max() + finish[6]  # the dropped client missed the round's deadline
        clients = [{"round": r, "client_id": int(c), "finish_time": float(f), "dropped": i == 6}
                   for i, (c, f) in enumerate(zip(rng.choice(100, 8, replace=False), finish))]
        clients[-1] = {**clients[-1], "finish_time": float("nan"), "dropped": True}
        write_parquet(clients, run_dir / "clients.parquet" / f"round-{r:06d}.parquet")
        round_time = float(finish[:6].max()) + 0.5
        sim_time += round_time
        row = {"round": r, "clients": 6, "selected": 8, "dropped": 2, "sim_time": sim_time, "gamma": 20.0 * r,
               "round_sim_time": round_time}
        if r % 10 == 0 or r == rounds:
            curves = {"test_accuracy": 1 - 0.9 * np.exp(-speed * r / 40), "test_loss": 2 * np.exp(-speed * r / 30)}
            row.update({m: curves.get(m, float(r)) for m in metrics})
        rows.append(row)
    write_parquet(rows, run_dir / "rounds.parquet")
    write_text(yaml.safe_dump({"name": name, "algorithm": {"name": "fedavg", "rounds": rounds}}), run_dir / "config.yaml")
    return run_dir


@pytest.fixture(scope="session")
def synthetic_run():
    """`write_run(run_dir, rounds=150, name=..., speed=..., metrics=(...), seed=0)`: a run's tables without training."""
    return write_run


@register_algorithm("fedavg_undeclared")
class FedAvgUndeclared(FedAvg):
    """FedAvg that does not declare its metrics: a callback's misspelled metric is found at the first evaluated
    round, not before the run."""

    @classmethod
    def metric_names(cls, cfg):
        return None
