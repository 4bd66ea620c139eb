"""FedAvg/FedProx against references computed independently of the algorithm's code."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from raysim.algorithms.fedavg import FedAvg, FedProx, batch_plan
from raysim.contract import ClientData, Context
from raysim.models import ModelConfig, ParamSpec, build_model
from raysim.rng import stream


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float64), y.astype(np.int64)


def make(cls, dtype="float64", num_clients=1, per_round=1, **params):
    ctx = Context(seed=3, rounds=5, clients_per_round=per_round, num_clients=num_clients,
                  client_sizes=np.ones(num_clients), feature_shape=(64,), image_shape=(1, 8, 8), num_classes=10,
                  model=ModelConfig(name="mlp", hidden=[16], dtype=dtype), params=cls.Params(**params))
    return cls(ctx)


def clients(x, y, sizes, dtype=torch.float64, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for c, n in enumerate(sizes):
        i = rng.choice(len(y), n, replace=False)
        out.append(ClientData(c, torch.as_tensor(x[i], dtype=dtype), torch.as_tensor(y[i])))
    return out


def test_one_client_full_batch_equals_centralized_gradient_descent(digits):
    """FedAvg, one client holding all data, full-batch steps, server lr 1 == plain GD (float64, 1e-10)."""
    x, y = digits
    lr, steps, rounds = 0.5, 3, 4
    algo = make(FedAvg, lr=lr, local_steps=steps, batch_size=None)
    data = ClientData(0, torch.as_tensor(x), torch.as_tensor(y))
    state = algo.init()
    for t in range(1, rounds + 1):
        plan = algo.plan(state, t, stream(0, t, -1, "plan"))
        assert plan.clients.tolist() == [0]
        reply, _, cost = algo.step(None, data, plan.broadcast, stream(0, t, 0, "step"))
        assert cost.oracle_calls == steps * len(y) and cost.oracle_batches == steps
        state, _ = algo.aggregate(state, [reply], None)

    module = build_model(algo.ctx.model, (64,), None, 10)
    spec = ParamSpec.of(module)
    theta = torch.as_tensor(algo.init().params).clone()
    for _ in range(rounds * steps):
        params = {k: v.clone().requires_grad_(True) for k, v in spec.unflatten(theta).items()}
        loss = F.cross_entropy(torch.func.functional_call(module, params, (torch.as_tensor(x),)), torch.as_tensor(y))
        grads = torch.autograd.grad(loss, list(params.values()))
        theta = theta - lr * torch.cat([g.reshape(-1) for g in grads])
    assert np.max(np.abs(state.params - theta.numpy())) < 1e-10


@pytest.mark.parametrize("cls,extra", [(FedAvg, {}), (FedProx, {"mu": 0.3})])
@pytest.mark.parametrize("epochs", [False, True])
def test_vectorized_shard_equals_per_client_loop(digits, cls, extra, epochs):
    x, y = digits
    length = {"local_epochs": 2} if epochs else {"local_steps": 7}
    algo = make(cls, num_clients=8, per_round=8, lr=0.2, batch_size=6, **length, **extra)
    datas = clients(x, y, [3, 5, 6, 11, 17, 30, 2, 9])
    theta = algo.init().params
    vec = algo.step_many([None] * 8, datas, theta, [stream(1, 2, d.client_id, "step") for d in datas])
    loop = [algo.step(None, d, theta, stream(1, 2, d.client_id, "step")) for d in datas]
    for (rv, _, cv), (rl, _, cl) in zip(vec, loop):
        assert cv == cl
        assert np.max(np.abs(rv.total - rl.total)) < 1e-12
        assert rv.weight == rl.weight


def test_fedprox_with_mu_zero_equals_fedavg(digits):
    x, y = digits
    datas = clients(x, y, [12, 20, 7])
    avg = make(FedAvg, num_clients=3, per_round=3, lr=0.1, local_steps=5, batch_size=4)
    prox = make(FedProx, num_clients=3, per_round=3, lr=0.1, local_steps=5, batch_size=4, mu=0.0)
    theta = avg.init().params
    a = avg.step_many([None] * 3, datas, theta, [stream(0, 1, c, "step") for c in range(3)])
    p = prox.step_many([None] * 3, datas, theta, [stream(0, 1, c, "step") for c in range(3)])
    for ra, rp in zip(a, p):
        np.testing.assert_array_equal(ra[0].total, rp[0].total)


def test_fedprox_proximal_term_pulls_towards_broadcast(digits):
    x, y = digits
    datas = clients(x, y, [40])
    theta = make(FedAvg).init().params
    drift = {}
    for mu in (0.0, 1.0, 10.0):
        algo = make(FedProx, lr=0.05, local_steps=20, batch_size=8, mu=mu)
        reply, _, _ = algo.step(None, datas[0], theta, stream(0, 1, 0, "step"))
        drift[mu] = np.linalg.norm(reply.total / reply.weight)
    assert drift[0.0] > drift[1.0] > drift[10.0] > 0


def test_shard_pre_reduction_equals_server_sum(digits):
    x, y = digits
    algo = make(FedAvg, num_clients=4, per_round=4, lr=0.1, local_steps=3, batch_size=5)
    datas = clients(x, y, [5, 9, 13, 4])
    state = algo.init()
    replies = [o[0] for o in algo.step_many([None] * 4, datas, state.params, [stream(0, 1, c, "step") for c in range(4)])]
    whole, _ = algo.aggregate(state, replies, None)
    shards, _ = algo.aggregate(state, [algo.reduce(replies[:2]), algo.reduce(replies[2:])], None)
    np.testing.assert_allclose(whole.params, shards.params, atol=1e-14)
    weights = np.array([5, 9, 13, 4], dtype=float)
    deltas = np.array([r.total / r.weight for r in replies])
    np.testing.assert_allclose(whole.params - state.params, (weights[:, None] * deltas).sum(0) / weights.sum(), atol=1e-14)


def test_batch_plan_covers_each_sample_once_per_epoch():
    plan = batch_plan(23, 5, None, 2, np.random.default_rng(0))
    assert plan.idx.shape == (10, 5)
    for epoch in range(2):
        rows = slice(epoch * 5, (epoch + 1) * 5)
        used = plan.idx[rows][plan.w[rows] > 0]
        assert sorted(used.tolist()) == list(range(23))
    assert plan.w.sum() == 46


def test_batch_larger_than_client_uses_all_samples():
    plan = batch_plan(3, 10, 4, None, np.random.default_rng(0))
    assert plan.idx.shape == (4, 3) and plan.w.sum() == 12
