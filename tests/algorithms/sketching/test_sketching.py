"""IterativeSketchingFL (Algorithms 1/2) against FedAvg, sketched GD computed independently, the DP
calibration, and an end-to-end run on Ray (specs/sketching.md §7 B-C, E)."""
import pickle

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

import raysim
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.sketching.algorithm import Broadcast, IterativeSketchingFL, SketchingParams
from raysim.contract import ClientData, Context
from raysim.models import ModelConfig, build_model, ParamSpec
from raysim.algorithms.sketching.privacy import gaussian_sigma
from raysim.rng import stream
from raysim.algorithms.sketching.sketch import make_sketch

torch.set_num_threads(1)
SIZES = [20, 35, 50]


@pytest.fixture(scope="module")
def datas():
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    out = []
    for c, n in enumerate(SIZES):
        i = rng.choice(len(y), n, replace=False)
        out.append(ClientData(c, torch.tensor(x[i] / 16.0), torch.tensor(y[i])))
    return out


def make(cls, model="mlp", **params):
    ctx = Context(seed=3, rounds=5, clients_per_round=len(SIZES), num_clients=len(SIZES), client_sizes=np.array(SIZES),
                  feature_shape=(64,), image_shape=None, num_classes=10,
                  model=ModelConfig(name=model, hidden=[8], dtype="float64"), params=cls.Params(**params))
    return cls(ctx)


def run_rounds(algo, datas, rounds):
    """Drive the contract in-process: plan, every client's step, aggregate; returns server states and replicas."""
    state = algo.init()
    cstates = [algo.client_init(c) for c in range(len(datas))]
    states = [state]
    for t in range(1, rounds + 1):
        plan = algo.plan(state, t, stream(0, t, -1, "plan"))
        assert plan.clients.tolist() == list(range(len(datas)))
        outs = algo.step_many(cstates, datas, plan.broadcast, [stream(0, t, c, "step") for c in range(len(datas))])
        cstates = [o[1] for o in outs]
        state, _ = algo.aggregate(state, [o[0] for o in outs], None)
        states.append(state)
    return states, cstates, outs


def test_none_equals_fedavg_full_batch_bitwise(datas):
    """kind none: Alg. 1 == FedAvg with full-batch local GD, uniform weights and server lr η_global, bitwise (§7 B7)."""
    sk = make(IterativeSketchingFL, sketch="none", lr=0.3, local_steps=3, server_lr=0.7)
    fa = make(FedAvg, lr=0.3, local_steps=3, batch_size=None, weighting="uniform", server_lr=0.7)
    states, _, _ = run_rounds(sk, datas, 4)
    theta = fa.init()
    for t in range(1, 5):
        plan = fa.plan(theta, t, stream(0, t, -1, "plan"))
        outs = fa.step_many([None] * 3, datas, plan.broadcast, [stream(0, t, c, "step") for c in range(3)])
        theta, _ = fa.aggregate(theta, [o[0] for o in outs], None)
        np.testing.assert_array_equal(states[t].params, theta.params)


@pytest.mark.parametrize("kind", ["gaussian", "srht", "countsketch", "sparse_ii"])
def test_k1_is_sketched_gradient_descent(datas, kind):
    """K = 1, full batch: w^{t+1} = w^t − η_g η_l R_tᵀR_t ∇f(w^t), f = (1/N) Σ f_c, to 1e-12 (§7 B8).

    The reference uses autograd of the whole objective and the dense R_t; it shares no code with the step.
    """
    algo = make(IterativeSketchingFL, sketch=kind, b_sketch=100, nnz_per_col=2, lr=0.4, local_steps=1, server_lr=0.5)
    states, replicas, _ = run_rounds(algo, datas, 3)
    module = build_model(algo.ctx.model, (64,), None, 10)
    spec = ParamSpec.of(module)
    w = torch.tensor(states[0].params)
    for t in range(1, 4):
        wr = w.clone().requires_grad_(True)
        params = spec.unflatten(wr)
        f = sum(F.cross_entropy(torch.func.functional_call(module, params, (d.x,)), d.y) for d in datas) / len(datas)
        (g,) = torch.autograd.grad(f, wr)
        R = make_sketch(kind, 100, spec.size, 3, t, 2).matrix()
        w = w - 0.5 * 0.4 * R.T @ (R @ g)
        assert float(torch.max(torch.abs(torch.tensor(states[t].params) - w))) < 1e-12
    # replica consistency (§7 E25): the clients' replica at round 3's start equals the server's after round 2
    assert all(np.array_equal(r.params, states[2].params) for r in replicas)


def test_costs_and_broadcast_carry_b_numbers(datas):
    """Upload Cost is b of d numbers (upload_vectors = b/d, 8b bytes in float64); no matrix travels (§7 A5, B14)."""
    algo = make(IterativeSketchingFL, sketch="gaussian", b_sketch=50, lr=0.1, local_steps=2)
    states, _, outs = run_rounds(algo, datas, 2)
    d = algo.spec.size
    for (reply, _, cost), n in zip(outs, SIZES):
        assert reply.total.shape == (50,)
        assert cost.upload_vectors == 50 / d and cost.upload_bytes == 8 * 50
        assert cost.oracle_calls == 2 * n and cost.oracle_batches == 2
    plan = algo.plan(states[-1], 3, None)
    assert plan.broadcast.delta.shape == (50,) and len(pickle.dumps(plan.broadcast)) < 8 * 50 + 400


def test_dp_noise_matches_calibration_and_is_fresh(datas):
    """DP noise: per-coordinate std within 1% of σ = sqrt(2 ln(1.25/δ̂))·2C/ε̂, mean 0, fresh per client and round (§7 C15).

    With C far above every per-example gradient norm clipping is inactive, so the DP update minus the
    noiseless one (same batches) is exactly −η ξ.
    """
    kw = dict(sketch="none", lr=1.0, local_steps=2, batch_size=8)
    dp = make(IterativeSketchingFL, model="logreg", dp={"epsilon": 0.5, "delta": 1e-5, "clip": 1e4}, **kw)
    plain = make(IterativeSketchingFL, model="logreg", **kw)
    sigma = gaussian_sigma(0.5, 1e-5, 2e4)
    assert dp.sigma == pytest.approx(sigma, rel=1e-12)
    replicas = [dp.client_init(c) for c in range(3)]
    noise = []
    for t in range(1, 21):
        bc = Broadcast(t, None, t - 1)  # round t's keys, every round from w^0 so both runs see the same points
        rngs = lambda: [stream(0, t, c, "step") for c in range(3)]  # noqa: E731
        a = dp.step_many(replicas, datas, bc, rngs())
        b = plain.step_many(replicas, datas, bc, rngs())
        noise += [(ra[0].total - rb[0].total) / -1.0 for ra, rb in zip(a, b)]
    xi = np.stack(noise)  # [rounds*clients, d]: sum of the two steps' noise (K = 2, lr 1) = sigma*(xi_1 + xi_2)
    std = xi.std() / np.sqrt(2)
    assert abs(std / sigma - 1) < 0.01, std / sigma
    assert abs(xi.mean()) < 4 * xi.std() / np.sqrt(xi.size)
    corr = np.corrcoef(xi[:-3].reshape(-1), xi[3:].reshape(-1))[0, 1]  # other rounds / clients
    assert abs(corr) < 0.02


def test_dp_error_grows_as_epsilon_falls(datas):
    """Privacy-utility: the final training loss increases as ε̂ decreases, at fixed b (§7 C18)."""
    losses = []
    for eps in (0.9, 0.3, 0.05):
        algo = make(IterativeSketchingFL, model="logreg", sketch="countsketch", b_sketch=130, lr=0.5, local_steps=1,
                    dp={"epsilon": eps, "delta": 1e-5, "clip": 1.0})
        states, _, _ = run_rounds(algo, datas, 10)
        w = torch.tensor(states[-1].params)
        f = sum(algo.objective(w, d.x, d.y) for d in datas) / 3
        losses.append(float(f))
    assert losses[0] < losses[1] < losses[2], losses


def test_accountant_metrics_in_evaluate(datas):
    algo = make(IterativeSketchingFL, model="logreg", sketch="countsketch", b_sketch=65, local_steps=1,
                dp={"epsilon": 0.1, "delta": 1e-6, "accountant_delta": 1e-5})
    states, _, _ = run_rounds(algo, datas, 2)
    x = torch.cat([d.x for d in datas])
    y = torch.cat([d.y for d in datas])
    from raysim.contract import EvalData

    m = algo.evaluate(states[-1], EvalData(x, y, x, y))
    assert m["dp_eps_paper"] == pytest.approx(np.sqrt(2) * 0.1) and m["dp_delta_paper"] == pytest.approx(2e-6)
    assert m["dp_eps_advanced"] == pytest.approx(np.sqrt(4 * np.log(1e5)) * 0.1 + 4 * 0.01)
    assert m["dp_eps_exact"] <= m["dp_eps_rdp"] and m["sketch_b"] == 65


@pytest.mark.parametrize("params,field", [
    ({"dp": {"epsilon": 0.8}, "local_steps": 4}, "dp.epsilon"),
    ({"sketch": "rademacher"}, "sketch"),
])
def test_bad_params_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        SketchingParams(**params)


def test_b_larger_than_d_and_partial_participation_are_errors():
    with pytest.raises(ValueError, match="algorithm.b_sketch"):
        make(IterativeSketchingFL, sketch="gaussian", b_sketch=10**6)
    ctx = Context(seed=0, rounds=1, clients_per_round=2, num_clients=3, client_sizes=np.ones(3), feature_shape=(64,),
                  image_shape=None, num_classes=10, model=ModelConfig(name="logreg"), params=SketchingParams())
    with pytest.raises(ValueError, match="clients_per_round"):
        IterativeSketchingFL(ctx)


def test_end_to_end_on_ray(ray_cluster, tmp_path):
    """A tiny DP sketched run through the real runtime: b-number uploads in the ledger, accountants in rounds.parquet."""
    cfg = {"name": "sk", "seed": 1, "data": {"source": "digits", "num_clients": 4, "partition": {"kind": "iid"}},
           "model": {"name": "logreg"},
           "algorithm": {"name": "sketching", "rounds": 3, "clients_per_round": 4, "lr": 0.5, "local_steps": 2,
                         "sketch": "countsketch", "b_sketch": 65, "batch_size": 16,
                         "dp": {"epsilon": 0.5, "clip": 1.0}},
           "system": {"comm": {"phi": 10.0}}, "cluster": {"num_actors": 2}}
    result = raysim.run(cfg, out=tmp_path / "run")
    rounds = pd.read_parquet(tmp_path / "run" / "rounds.parquet")
    assert list(rounds["upload_bytes"]) == [4 * 65 * 4 * t for t in (1, 2, 3)]  # float32: 4 bytes a number
    for col in ("dp_eps_paper", "dp_eps_advanced", "dp_eps_rdp", "dp_eps_exact", "test_accuracy"):
        assert col in rounds
    assert np.all(np.diff(rounds["dp_eps_advanced"]) > 0)
    from raysim.report import report

    names = {p.name for p in report(result.run_dir)}
    assert {"sketching_error.png", "privacy_accountants.png"} <= names
