"""Helpers of the zeroth-order tests: build a ZO algorithm without Ray and drive its rounds in process."""
import numpy as np
import pytest

from raysim.contract import ClientData, Context
from raysim.models import ModelConfig
from raysim.rng import SERVER, stream


def make(cls, num_clients=5, seed=0, per_round=None, **params):
    """An algorithm of `cls` for `num_clients` black-box clients (no data: the objective is synthetic)."""
    ctx = Context(seed=seed, rounds=1, clients_per_round=per_round or num_clients, num_clients=num_clients,
                  client_sizes=np.ones(num_clients), feature_shape=(1,), image_shape=None, num_classes=1,
                  model=ModelConfig(), params=cls.Params(**params))
    return cls(ctx)


def drive(algo, rounds):
    """Run `rounds` raysim rounds (phases) as the server would; returns (states per round, costs per round)."""
    n = algo.ctx.num_clients
    cstates = {c: algo.client_init(c) for c in range(n)}
    state = algo.init()
    history = []
    for t in range(1, rounds + 1):
        plan = algo.plan(state, t, stream(algo.ctx.seed, t, SERVER, "plan"))
        replies, costs = [], []
        for c in plan.clients.tolist():
            reply, cstates[c], cost = algo.step(cstates[c], ClientData(c, None, None), plan.broadcast,
                                                stream(algo.ctx.seed, t, c, "step"))
            replies.append(reply)
            costs.append(cost)
        state, server_cost = algo.aggregate(state, replies, None)
        history.append((state, plan.phase, costs, server_cost))
    return history


@pytest.fixture
def driver():
    return make, drive


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every test of tests/zo runs on one torch thread."""
