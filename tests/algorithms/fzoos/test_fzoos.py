"""FZooS: exact query and message accounting, the correction schedule, active queries ranked by the
trace, persistent client state, and end-to-end runs through the real runtime (FZooS, algorithms/fzoos/README.md)."""
import hashlib

import numpy as np
import pytest
import ray
import torch

import raysim
from raysim.algorithms.fzoos.family import ZOBroadcast
from raysim.algorithms.fzoos.fzoos import FZooS, correction_length
from raysim.algorithms.fzoos import gp, rff
from raysim.contract import ClientData


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_queries_and_uploads_per_client_and_round_are_exact(driver, one_round):
    """10 initial + 56 local + 51 end-of-round = 107 per round at T = 10; uploads d then M floats."""
    d, m = 20, 300
    algo = driver[0](FZooS, objective={"dim": d}, num_features=m)
    state, cstates = algo.init(), {c: algo.client_init(c) for c in range(5)}
    expected = [("local", 10 + 56), ("surrogate", 51), ("local", 56), ("surrogate", 51)]
    for t, (phase, calls) in enumerate(expected, 1):
        state, costs, got, _ = one_round(algo, state, cstates, t)
        assert got == phase
        assert [c.oracle_calls for c in costs] == [calls] * 5
        floats = d if phase == "local" else m
        assert all(c.upload_bytes == 8 * floats and c.upload_vectors == floats / d for c in costs)
    assert state.zo_round == 2
    assert all(s.history.n == 10 + 2 * 107 for s in cstates.values())  # the history persists in the client
    assert all(s.w_own is not None and s.w_own.shape == (m,) for s in cstates.values())
    assert torch.allclose(state.shared, torch.stack([s.w_own for s in cstates.values()]).mean(0))


def test_correction_length_schedules():
    """gamma = 1/t (paper, App. E), constant, or max(1/t, floor)."""
    assert [correction_length("inv_t", t, 1.0, 0.1) for t in (1, 2, 4)] == [1.0, 0.5, 0.25]
    assert correction_length("const", 7, 1.0, 0.1) == 1.0
    assert [correction_length("floored", t, 1.0, 0.3) for t in (1, 2, 5)] == [1.0, 0.5, 0.3]


def test_no_correction_in_round_one_then_the_surrogates_change_the_steps(driver, one_round):
    """Round 1 has no w_0: its iterate does not depend on M; round 2's does."""
    xs = {}
    for m in (50, 400):
        algo = driver[0](FZooS, num_clients=3, objective={"dim": 8}, num_features=m, local_steps=3)
        state, cstates = algo.init(), {c: algo.client_init(c) for c in range(3)}
        rounds = []
        for t in range(1, 4):
            state, _, _, _ = one_round(algo, state, cstates, t)
            rounds.append(state.x.clone())
        xs[m] = rounds
    assert torch.equal(xs[50][0], xs[400][0])
    assert not torch.equal(xs[50][2], xs[400][2])


@pytest.mark.parametrize("gamma,expected", [
    ({"gamma": "inv_t"}, (-3.8480368, -1.9891231)),
    ({"gamma": "const", "gamma_value": 0.25}, (-1.4918423, -1.2037249)),
])
def test_corrected_gradient_is_eq_8_on_a_case_computed_by_hand(driver, monkeypatch, gamma, expected):
    """Eq. (8) at t = 1, by hand: d = 2, l = 0.1, sigma^2 = 1e-6, x = (0.5, 0.5) where every quadratic client is
    f(x) = 1/(10 d) = 0.05; plain SGD (lr 0.01) and T = 1, so g_hat = (x - x_1) / lr.
    GP (eq. (5)): history {p, x}, p - x = s (0.6, 0.8) with s = l sqrt(2 ln 2) (so k(x, p) = 1/2), y(p) = -0.25:
    scaled targets (0, 1), range 0.3; alpha_p = -k / ((1 + sigma^2)^2 - k^2), hence
    grad mu(x) = 0.3 / l^2 * alpha_p k (p - x) = -30 (0.25 / 0.750002) s (0.6, 0.8) = -(0.7064441, 0.9419255).
    RFF: M = 2, v_1 = (pi, 0), v_2 = (0, pi/3), b = 0: sin(V x + b) = (1, 1/2); w_glob - w_own = (3, 1) - (2, -1)
    = (1, 2), so grad mu_hat_glob(x) - grad mu_hat_own(x) = -sqrt(2/2) (1 * 1 * v_1 + 2 * 1/2 * v_2) = -(pi, pi/3).
    g_hat = grad mu(x) + gamma (-(pi, pi/3)) with gamma = 1/t = 1, or the constant 0.25."""
    features = rff.RandomFeatures(torch.tensor([[np.pi, 0.0], [0.0, np.pi / 3]], dtype=torch.float64),
                                  torch.zeros(2, dtype=torch.float64))
    monkeypatch.setattr(FZooS, "features", property(lambda self: features))
    algo = driver[0](FZooS, num_clients=1, objective={"dim": 2}, num_features=2, lengthscale=0.1,
                     optimizer="sgd", lr=0.01, local_steps=1, **gamma)
    x = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert float(algo.objective.local(0, x[None])[0]) == pytest.approx(0.05, abs=1e-15)
    state = algo.client_init(0)
    s = 0.1 * np.sqrt(2 * np.log(2))
    state.history.add(x[None] + s * torch.tensor([[0.6, 0.8]], dtype=torch.float64),
                      torch.tensor([-0.25], dtype=torch.float64))
    state.w_own = torch.tensor([2.0, -1.0], dtype=torch.float64)
    broadcast = ZOBroadcast("local", x, torch.tensor([3.0, 1.0], dtype=torch.float64))
    reply, _, _ = algo.step(state, ClientData(0, None, None), broadcast, np.random.default_rng(0))
    g_hat = (x - reply.parts[0]) / 0.01
    assert torch.allclose(g_hat, torch.tensor(expected, dtype=torch.float64), atol=1e-6)


def test_active_queries_are_the_candidates_of_largest_gradient_trace(driver):
    """Active queries (README): the queried points are the top-k candidates by tr Sigma_grad (not the spectral norm)."""
    algo = driver[0](FZooS, num_clients=1, objective={"dim": 30})
    state = algo.client_init(0)
    x = algo.objective.x0
    X = x + 0.02 * (2 * torch.rand(40, 30, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) - 1)
    state.history.add(X, algo.objective.local(0, X))
    assert algo._active(state, 0, x, 0.01, 100, 5, np.random.default_rng(1)) == 5
    C = (x + 0.01 * torch.from_numpy(np.random.default_rng(1).uniform(-1, 1, (100, 30)))).clamp(0, 1)
    model = gp.fit(X, None, 1.0, 1e-6, center=x)
    traces = torch.stack([torch.trace(gp.grad_cov(model, c)) for c in C])
    assert torch.allclose(state.history.X[40:45], C[torch.topk(traces, 5).indices])


def test_ml2_length_scale_is_used_by_the_gradient_and_the_uncertainty_gp_alike(driver, monkeypatch):
    """lengthscale_fit: ml2 refits l by marginal likelihood; the official code ranks active queries with that
    fitted l too, so every GP a step conditions, with or without targets, uses the ML-II length scale."""
    used = []
    fit = gp.fit

    def recorded(X, y, lengthscale, noise, center, outputscale=1.0):
        used.append(("mean" if y is not None else "uncertainty", lengthscale))
        return fit(X, y, lengthscale, noise, center, outputscale)

    monkeypatch.setattr(gp, "fit_lengthscale", lambda X, y, lengthscale, noise, steps, lr=0.1: 0.25)
    monkeypatch.setattr(gp, "fit", recorded)
    algo = driver[0](FZooS, num_clients=1, objective={"dim": 4}, num_features=50, local_steps=2,
                     lengthscale_fit="ml2")
    state, x = algo.client_init(0), algo.objective.x0
    algo.step(state, ClientData(0, None, None), ZOBroadcast("local", x, None), np.random.default_rng(0))
    assert {kind for kind, _ in used} == {"mean", "uncertainty"}
    assert all(ell == 0.25 for _, ell in used), used


TINY = {
    "name": "fzoos-tiny",
    "seed": 3,
    "data": {"source": "blackbox", "num_clients": 3, "partition": {"kind": "natural"}},
    "algorithm": {"name": "fzoos", "rounds": 4, "clients_per_round": 3, "local_steps": 3, "num_features": 200,
                  "objective": {"kind": "quadratic", "dim": 10, "heterogeneity": 5.0}},
    "cluster": {"num_actors": 2, "cpus_per_actor": 1},
}


def test_end_to_end_and_same_trajectory_whatever_the_number_of_actors(ray_cluster, tmp_path):
    """Through the runtime: phases, counters and F; 2 actors and the local backend give bit-identical trajectories."""
    two = raysim.run(TINY, out=tmp_path / "two").rounds
    assert list(two["phase"]) == ["local", "surrogate"] * 2
    assert list(two["zo_round"]) == [1, 1, 2, 2]
    per_round = 1 + 3 + 5 * 2 + 1 + 50
    assert two["oracle_calls"].iloc[-1] == 3 * (10 + 2 * per_round)
    assert two["upload_bytes"].iloc[-1] == 2 * 3 * 8 * (10 + 200)
    assert np.allclose(two["gap"], two["objective"] + 0.025 - 0.1 / 10)
    assert two["objective"].iloc[-1] < two["objective"].iloc[0]
    one = raysim.run(TINY, out=tmp_path / "one", backend="local").rounds
    for col in ["objective", "oracle_calls", "upload_bytes"]:
        np.testing.assert_array_equal(one[col], two[col])


@ray.remote
def _features_digest(seed, m, d):
    import os

    from raysim.algorithms.fzoos.rff import shared_features

    rf = shared_features(seed, m, d, 1.0)
    return os.getpid(), hashlib.sha256(rf.V.numpy().tobytes() + rf.b.numpy().tobytes()).hexdigest()


def test_identical_random_features_in_every_process(ray_cluster):
    """Every actor draws the same (V, b) from the seed."""
    results = ray.get([_features_digest.remote(4, 500, 30) for _ in range(4)])
    here = rff.shared_features(4, 500, 30, 1.0)
    local = hashlib.sha256(here.V.numpy().tobytes() + here.b.numpy().tobytes()).hexdigest()
    assert {h for _, h in results} == {local}
