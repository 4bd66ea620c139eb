"""IterativeSketchingFL (Algorithms 1/2) against FedAvg, sketched GD computed independently, the DP
calibration, and an end-to-end run on Ray (the sketching paper, algorithms/sketching/README.md)."""
import math
import pickle

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from scipy.linalg import hadamard
from sklearn.datasets import load_digits

import raysim
from raysim.algorithms.fedavg import FedAvg
from raysim.algorithms.sketching.algorithm import Broadcast, IterativeSketchingFL, SketchingParams
from raysim.algorithms.sketching.privacy import gaussian_sigma
from raysim.algorithms.sketching.sketch import make_sketch
from raysim.contract import ClientData, Context
from raysim.core.rng import stream
from raysim.models import ModelConfig, build_model, ParamSpec

torch.set_num_threads(1)
SIZES = [20, 35, 50]


def digits_clients(sizes):
    """Clients holding `sizes` distinct random digits each (features in [0, 1])."""
    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(0)
    out = []
    for c, n in enumerate(sizes):
        i = rng.choice(len(y), n, replace=False)
        out.append(ClientData(c, torch.tensor(x[i] / 16.0), torch.tensor(y[i])))
    return out


@pytest.fixture(scope="module")
def datas():
    return digits_clients(SIZES)


def make(cls, model="mlp", sizes=SIZES, **params):
    ctx = Context(seed=3, rounds=5, clients_per_round=len(sizes), num_clients=len(sizes), client_sizes=np.array(sizes),
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
    """kind none: Alg. 1 == FedAvg with full-batch local GD, uniform weights and server lr η_global, bitwise."""
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
    """K = 1, full batch: w^{t+1} = w^t − η_g η_l R_tᵀR_t ∇f(w^t), f = (1/N) Σ f_c, to 1e-12 (App. E).

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
    # replica consistency: the clients' replica at round 3's start equals the server's after round 2
    assert all(np.array_equal(r.params, states[2].params) for r in replicas)


def test_costs_and_broadcast_carry_b_numbers(datas):
    """Upload Cost is b of d numbers (upload_vectors = b/d, 8b bytes in float64); no matrix travels."""
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
    """DP noise: per-coordinate std within 1% of σ = sqrt(2 ln(1.25/δ̂))·2C/ε̂, mean 0, fresh per client and round (Lemma H.7).

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


def test_dp_per_example_gradients_of_a_client_do_not_depend_on_who_shares_its_shard():
    """A CNN's per-example gradients are vmapped convolutions, whose kernels change with the number of clients in a
    call (before, a client's differed alone, with one other and with three): in calls of a fixed width they do not."""
    ctx = Context(seed=3, rounds=5, clients_per_round=6, num_clients=6, client_sizes=np.full(6, 8), feature_shape=(192,),
                  image_shape=(3, 8, 8), num_classes=10, model=ModelConfig(name="cnn", channels=[32]),
                  params=SketchingParams(sketch="none", batch_size=4, local_steps=1,
                                         dp={"epsilon": 0.5, "delta": 1e-5, "clip": 1.0}))
    algo = IterativeSketchingFL(ctx)
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(6, algo.spec.size, generator=g) * 0.2
    x, y, w = torch.randn(6, 4, 192, generator=g), torch.randint(0, 10, (6, 4), generator=g), torch.ones(6, 4)
    every = algo._grads(theta, x, y, w)
    for k in (1, 2, 3, 5):
        assert torch.equal(algo._grads(theta[:k], x[:k], y[:k], w[:k]), every[:k]), k


@pytest.mark.parametrize("batch_size,batches", [
    (4, [[4, 4, 2], [3, 3, 3], [4, 4, 4]]),  # n = 10: a pass's last batch has 2; n = 3 < B
    (None, [[10] * 3, [3] * 3, [8] * 3]),  # full batch: each client's own size, not the largest
])
def test_batch_mean_sensitivity_uses_each_batch_size(batch_size, batches):
    """`batch_mean`: a step over B' examples adds N(0, σ²I) with σ = sqrt(2 ln(1.25/δ̂))·2C/(ε̂ B'), the Δ₂ of a mean of
    B' clipped gradients; so K = 3 steps add noise of per-coordinate std sqrt(Σ_s σ_s²), within 3% over 20 rounds.

    Clients hold 10, 3 and 8 examples; C is far above every gradient norm, so DP minus noiseless update (same
    batches, lr 1) is the noise (the gradients' O(10) difference is negligible next to σ ≈ 1e4).
    """
    sizes, eps, delta, clip = [10, 3, 8], 0.5, 1e-5, 1e4
    kw = dict(sketch="none", lr=1.0, local_steps=3, batch_size=batch_size)
    dp = make(IterativeSketchingFL, model="logreg", sizes=sizes,
              dp={"epsilon": eps, "delta": delta, "clip": clip, "sensitivity": "batch_mean"}, **kw)
    plain = make(IterativeSketchingFL, model="logreg", sizes=sizes, **kw)
    clients = digits_clients(sizes)
    replicas = [dp.client_init(c) for c in range(3)]
    noise = [[] for _ in sizes]
    for t in range(1, 21):
        bc = Broadcast(t, None, t - 1)
        rngs = lambda: [stream(0, t, c, "step") for c in range(3)]  # noqa: E731
        noisy, clean = dp.step_many(replicas, clients, bc, rngs()), plain.step_many(replicas, clients, bc, rngs())
        for c, (a, b) in enumerate(zip(noisy, clean)):
            noise[c].append(b[0].total - a[0].total)
    z = np.sqrt(2 * np.log(1.25 / delta)) / eps
    for c, steps in enumerate(batches):
        want = np.sqrt(sum((z * 2 * clip / n) ** 2 for n in steps))
        assert abs(np.std(noise[c]) / want - 1) < 0.03, (sizes[c], np.std(noise[c]) / want)


def isotropic_clients(seed: int, n: int = 16, k: int = 8, N: int = 4):
    """N clients of n examples whose design [1, x] is the n×n Hadamard matrix (ZᵀZ = nI), so logreg with the mse loss
    has f_c(w) = ½‖w − a_c‖² + const exactly (h = 1, d = nk); returns them and w* = mean a_c in the model's layout."""
    Z = hadamard(n).astype(float)
    rng = np.random.default_rng([5, seed])
    Ys = [rng.normal(0.0, 0.5, (n, k)) for _ in range(N)]
    theta = np.mean([Z.T @ Y / n for Y in Ys], axis=0)  # row 0: the bias, rows 1..: the weights' columns
    clients = [ClientData(c, torch.tensor(Z[:, 1:]), torch.tensor(Y)) for c, Y in enumerate(Ys)]
    return clients, np.concatenate([theta[1:].T.ravel(), theta[0]])


def dp_floor_ratio(kind: str, b: int, eta: float, c_R: float, seeds: int, rounds: int, burn: int = 50) -> float:
    """MC / predicted E‖w − w*‖² of Algorithm 2 (K = 1, full batch) run by IterativeSketchingFL on `isotropic_clients`,
    averaged over rounds burn+1..rounds; the prediction is the README's η² c_R d σ² / (N (2ηh − η²h²c_R)).

    σ = sqrt(2 ln(1.25/δ̂))·2C/ε̂ is computed here by hand; C = 100 is far above every per-example gradient norm
    (≤ 16‖w − a_c‖ < 40 here), so clipping is inactive and the model stays exactly quadratic.
    """
    N, n, k, eps, delta, clip = 4, 16, 8, 5000.0, 1e-5, 100.0
    sigma = math.sqrt(2 * math.log(1.25 / delta)) * 2 * clip / eps
    params = SketchingParams(sketch=kind, b_sketch=b, lr=eta, loss="mse",
                             dp={"epsilon": eps, "delta": delta, "clip": clip, "strict": False})
    errs = []
    for seed in range(seeds):
        clients, w_star = isotropic_clients(seed, n, k, N)
        ctx = Context(seed=seed, rounds=rounds, clients_per_round=N, num_clients=N, client_sizes=np.full(N, n),
                      feature_shape=(n - 1,), image_shape=None, num_classes=k,
                      model=ModelConfig(name="logreg", dtype="float64"), params=params)
        states, _, _ = run_rounds(IterativeSketchingFL(ctx), clients, rounds)
        errs += [float(((s.params - w_star) ** 2).sum()) for s in states[burn + 1:]]
    d = n * k
    return np.mean(errs) / (eta**2 * c_R * d * sigma**2 / (N * (2 * eta - eta**2 * c_R)))


@pytest.mark.parametrize("kind,b,eta,c_R,seeds,rounds", [
    ("none", 128, 0.5, 1.0, 1, 150),
    ("countsketch", 32, 0.1, 1 + 127 / 32, 2, 250),
])
def test_dp_noise_floor_of_the_algorithm(kind, b, eta, c_R, seeds, rounds):
    """The DP noise floor of IterativeSketchingFL's own steps matches the exact isotropic formula within 5%
    (d = 128, N = 4; the seeds' spread is about 1.5%)."""
    assert abs(dp_floor_ratio(kind, b, eta, c_R, seeds, rounds) - 1) < 0.05


@pytest.mark.slow
@pytest.mark.parametrize("kind,b,c_R", [
    ("none", 128, 1.0), ("countsketch", 32, 1 + 127 / 32), ("gaussian", 32, 1 + 129 / 32), ("srht", 32, 4.0),
])
def test_dp_noise_floor_of_the_algorithm_all_kinds(kind, b, c_R):
    """As above with 8 seeds x 600 rounds at η = 0.1: within 2%."""
    ratio = dp_floor_ratio(kind, b, 0.1, c_R, seeds=8, rounds=600)
    print(f"{kind}: MC/predicted floor {ratio:.4f}")
    assert abs(ratio - 1) < 0.02


def test_dp_error_grows_as_epsilon_falls(datas):
    """Privacy-utility: the final training loss increases as ε̂ decreases, at fixed b."""
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


@pytest.mark.slow  # long; run with -m slow
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
