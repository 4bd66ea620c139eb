"""The FedFisher server problem: Lemma 1, the Diag/FisherMerge identity (README), invariances, the
code's optimizer and the validation selection (FedFisher, algorithms/fedfisher/README.md)."""
import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher import KFAC, KFACBlock, curvature_layers, kfac_fisher
from raysim.algorithms.fedfisher.merge.average import weighted_average
from raysim.algorithms.fedfisher.merge.fedfisher import (DenseObjective, DiagObjective, KFACObjective, ServerOptimizer, min_norm_solution,
                                    solve)
from raysim.algorithms.fedfisher.merge.fisher_merge import fisher_merge
from raysim.models import ParamSpec


def low_rank_psd(rng, d, rank):
    u = rng.standard_normal((d, rank))
    return u @ u.T


def test_lemma1_gd_from_average_converges_to_min_norm_solution_and_keeps_null_space():
    rng = np.random.default_rng(0)
    d, m = 12, 3
    models = rng.standard_normal((m, d))
    fishers = np.stack([low_rank_psd(rng, d, 2) for _ in range(m)])  # rank 6 < d
    p = np.array([0.5, 0.3, 0.2])
    w_bar = weighted_average(models, p)
    obj = DenseObjective(models, fishers, p)
    f_sum, b = obj.f_sum.numpy(), obj.b.numpy()
    lr = 1.0 / np.linalg.eigvalsh(f_sum).max()
    target = min_norm_solution(f_sum, b, w_bar)
    res = solve(obj, w_bar, 20000, ServerOptimizer("gd", lr=lr))
    np.testing.assert_allclose(res.w, target, atol=1e-8)
    evals, evecs = np.linalg.eigh(f_sum)
    null = evecs[:, evals < 1e-9 * evals.max()]
    assert null.shape[1] == d - 6
    for steps in (1, 7, 200):
        w = solve(obj, w_bar, steps, ServerOptimizer("gd", lr=lr)).w
        np.testing.assert_allclose(null.T @ w, null.T @ w_bar, atol=1e-10)
    np.testing.assert_allclose(f_sum @ res.w, b, atol=1e-8)  # on the constraint set of (7)


def test_exact_diag_fedfisher_equals_fisher_merge_with_fedavg_fallback():
    rng = np.random.default_rng(1)
    m, d = 4, 50
    models = rng.standard_normal((m, d))
    fishers = rng.exponential(1.0, (m, d))
    fishers[:, :7] = 0.0  # no Fisher mass: must stay at FedAvg
    p = rng.dirichlet(np.ones(m))
    w_bar = weighted_average(models, p)
    obj = DiagObjective(models, fishers, p, dtype=torch.float64)
    res = solve(obj, w_bar, 5000, ServerOptimizer("gd", lr=1.0 / obj.f_sum.max().item()))
    merged = fisher_merge(models, fishers, p, floor=0.0)
    np.testing.assert_allclose(res.w, merged, atol=1e-10)
    np.testing.assert_allclose(res.w[:7], w_bar[:7], atol=1e-14)
    np.testing.assert_allclose(fisher_merge(models, fishers, p)[:7], w_bar[:7])


def test_weighting_on_client_or_server_gives_the_same_problem():
    rng = np.random.default_rng(2)
    models, fishers, p = rng.standard_normal((3, 9)), rng.exponential(1.0, (3, 9)), np.array([0.2, 0.3, 0.5])
    w = torch.as_tensor(rng.standard_normal(9))
    server = DiagObjective(models, fishers, p, dtype=torch.float64)
    client = DiagObjective(models, p[:, None] * fishers, np.ones(3), dtype=torch.float64)
    np.testing.assert_allclose(server.grad(w), client.grad(w), rtol=1e-12)
    np.testing.assert_allclose(server.value(w), client.value(w), rtol=1e-12)


def small_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3, bias=False)).double()


def kfac_clients(m, seed=0):
    net, spec = small_net(), None
    spec = ParamSpec.of(net)
    gen = torch.Generator().manual_seed(seed)
    models, fishers = [], []
    for _ in range(m):
        w = torch.randn(spec.size, generator=gen, dtype=torch.float64)
        torch.nn.utils.vector_to_parameters(w, net.parameters())
        fishers.append(kfac_fisher(net, torch.randn(30, 5, generator=gen, dtype=torch.float64)))
        models.append(w.numpy())
    return np.stack(models), fishers, spec


def dense_fisher(f):
    """The dense F_i of small_net's K-FAC in ParamSpec order: layer 0 is [W (4x5) | b (4)], so coordinates permute."""
    perm = np.concatenate([np.concatenate([np.arange(20).reshape(4, 5), 20 + np.arange(4)[:, None]], 1).reshape(-1),
                           24 + np.arange(12)])
    blk = np.zeros((36, 36))
    blk[:24, :24] = np.kron(f.blocks[0].G, f.blocks[0].A)
    blk[24:, 24:] = np.kron(f.blocks[1].G, f.blocks[1].A)
    full = np.zeros((36, 36))
    full[np.ix_(perm, perm)] = blk
    return full


def test_kfac_gradient_equals_the_dense_block_diagonal_fisher():
    models, fishers, spec = kfac_clients(3)
    p = np.array([0.1, 0.6, 0.3])
    obj = KFACObjective(models, fishers, p, spec, dtype=torch.float64)
    dense = [dense_fisher(f) for f in fishers]
    w = np.random.default_rng(3).standard_normal(36)
    expect = sum(pi * f @ (w - wi) for pi, f, wi in zip(p, dense, models))
    np.testing.assert_allclose(obj.grad(torch.as_tensor(w)).numpy(), expect, rtol=1e-9, atol=1e-12)
    value = sum(0.5 * pi * (w - wi) @ f @ (w - wi) for pi, f, wi in zip(p, dense, models))
    assert obj.value(torch.as_tensor(w)) == pytest.approx(value, rel=1e-9)


class NormNet(nn.Module):
    """Linear -> LayerNorm -> bias-free Linear, times a free parameter: two K-FAC layers and three diagonal tensors."""

    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 3, bias=False)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.fc2(torch.tanh(self.ln(self.fc1(x)))) * self.scale


def dense_mixed_fisher(spec, f):
    """f as a dense d x d matrix in ParamSpec order: G ⊗ A on each layer's [W | b] coordinates (row-major), the
    diagonal block's entries on the other parameters' coordinates."""
    index = {n: t.numpy() for n, t in spec.unflatten(torch.arange(spec.size)).items()}
    full = np.zeros((spec.size, spec.size))
    for b in f.blocks:
        w = index[b.layer.weight].reshape(b.layer.out_dim, -1)
        idx = (np.concatenate([w, index[b.layer.bias][:, None]], 1) if b.layer.bias else w).reshape(-1)
        full[np.ix_(idx, idx)] = np.kron(b.G, b.A)
    for name, v in f.diagonal.items():
        full[index[name].reshape(-1), index[name].reshape(-1)] = v.reshape(-1)
    return full


def test_kfac_gradient_includes_the_diagonal_block_of_parameters_outside_the_layers():
    """Three clients' K-FAC Fishers of NormNet (d = 39: fc1 16 + fc2 12 by K-FAC, ln 8 + scale 3 by the diagonal
    fallback): ∇Φ and Φ equal Σ p_i F_i (W − W_i) and ½ Σ p_i (W − W_i)^T F_i (W − W_i) with the dense mixed F_i; the
    diagonal's share of ∇Φ is far from 0."""
    torch.manual_seed(0)
    net = NormNet().double()
    spec, gen = ParamSpec.of(net), torch.Generator().manual_seed(1)
    models, fishers = [], []
    for _ in range(3):
        w = torch.randn(spec.size, generator=gen, dtype=torch.float64)
        torch.nn.utils.vector_to_parameters(w, net.parameters())
        fishers.append(kfac_fisher(net, torch.randn(20, 3, generator=gen, dtype=torch.float64), 8))
        models.append(w.numpy())
    models, p = np.stack(models), np.array([0.1, 0.6, 0.3])
    assert spec.size == 39 and sorted(fishers[0].diagonal) == ["ln.bias", "ln.weight", "scale"]
    obj = KFACObjective(models, fishers, p, spec, dtype=torch.float64)
    dense = [dense_mixed_fisher(spec, f) for f in fishers]
    w = np.random.default_rng(3).standard_normal(spec.size)
    expect = sum(pi * f @ (w - wi) for pi, f, wi in zip(p, dense, models))
    np.testing.assert_allclose(obj.grad(torch.as_tensor(w)).numpy(), expect, rtol=1e-9, atol=1e-12)
    value = sum(0.5 * pi * (w - wi) @ f @ (w - wi) for pi, f, wi in zip(p, dense, models))
    assert obj.value(torch.as_tensor(w)) == pytest.approx(value, rel=1e-9)
    rest = np.concatenate([spec.unflatten(torch.as_tensor(expect))[n].numpy() for n in ("ln.weight", "ln.bias", "scale")])
    assert np.abs(rest).min() > 1e-4


@pytest.mark.parametrize("kind", ["gd", "fedfisher_adam"])
@pytest.mark.parametrize("variant", ["diag", "kfac"])
def test_invariances_identical_clients_identity_fishers_and_one_client(variant, kind):
    """Each case's answer W (the shared model; FedAvg for F_i = cI; W_1 for M = 1) is reached from a start
    W̄ + δ away from it, not just kept from W̄ (where ∇Φ = 0 and any update rule stays): after 2000 steps the
    gradient Σ p_i F_i (W_T − W) is 1000x smaller than at the start (measured: ≤ 1.4e-4 of it), and gd leaves
    the start's component in null(Σ p_i F_i) unchanged (Lemma 1)."""
    models, fishers, spec = kfac_clients(3, seed=4)
    rng = np.random.default_rng(6)
    if variant == "diag":
        fishers = rng.exponential(1.0, models.shape)
        identity = np.ones_like(fishers) * 2.0
        dense = np.diag
    else:
        identity = [type(f)([type(b)(b.layer, 2.0 * np.eye(len(b.A)), np.eye(len(b.G))) for b in f.blocks])
                    for f in fishers]
        dense = dense_fisher
    p = np.array([0.2, 0.5, 0.3])
    same_f = [fishers[0]] * 3 if variant == "kfac" else np.repeat(fishers[:1], 3, 0)
    cases = [(np.repeat(models[:1], 3, 0), same_f, p, models[0]), (models, identity, p, weighted_average(models, p)),
             (models[:1], fishers[:1], np.ones(1), models[0])]
    for ms, fs, pp, answer in cases:
        obj = DiagObjective(ms, fs, pp, torch.float64) if variant == "diag" else KFACObjective(ms, fs, pp, spec, torch.float64)
        f_sum = sum(pi * dense(f) for pi, f in zip(pp, fs))
        lam = np.linalg.eigvalsh(f_sum)
        start = weighted_average(ms, pp) + 0.5 * rng.standard_normal(ms.shape[1])
        opt = ServerOptimizer("gd", lr=1.0 / lam.max()) if kind == "gd" else ServerOptimizer()
        w = solve(obj, start, 2000, opt).w
        assert np.linalg.norm(f_sum @ (w - answer)) < 1e-3 * np.linalg.norm(f_sum @ (start - answer))
        if kind == "gd":
            null = np.linalg.eigh(f_sum)[1][:, lam < 1e-9 * lam.max()]
            np.testing.assert_allclose(null.T @ w, null.T @ start, atol=1e-10)


def test_code_adam_update_without_bias_correction_and_eps_placement():
    """Two hand-computed steps of the code's rule on Φ(w) = ½ f w²: Diag has ε outside the sqrt."""
    obj = DiagObjective(np.zeros((1, 1)), np.full((1, 1), 3.0), np.ones(1), dtype=torch.float64)
    w, m, v = 1.0, 0.0, 0.0
    for _ in range(2):
        g = 3.0 * w
        m, v = g + 0.9 * m, g * g + 0.99 * v
        w -= 0.01 * m / (np.sqrt(v) + 0.01)
    assert solve(obj, np.ones(1), 2, ServerOptimizer()).w[0] == pytest.approx(w, rel=1e-12)
    obj.eps_inside_sqrt = True
    w, m, v = 1.0, 0.0, 0.0
    for _ in range(2):
        g = 3.0 * w
        m, v = g + 0.9 * m, g * g + 0.99 * v
        w -= 0.01 * m / np.sqrt(v + 0.01)
    assert solve(obj, np.ones(1), 2, ServerOptimizer()).w[0] == pytest.approx(w, rel=1e-12)


def test_kfac_update_has_epsilon_inside_the_square_root():
    """The code's K-FAC rule w -= lr m / sqrt(v + ε) (the code's App. D.3 Adam), by hand for 3 steps on one bias-free 2x2 layer
    with ∇Φ = (G ⊗ A)(w − w_1) from np.kron; |g| ~ 0.05 ~ sqrt(ε)/2, where ε outside the sqrt moves w 1.2-1.8x as far."""
    layer = nn.Linear(2, 2, bias=False).double()
    spec = ParamSpec.of(layer)
    a, g = np.array([[0.2, 0.05], [0.05, 0.1]]), np.array([[0.3, 0.1], [0.1, 0.2]])
    block = KFAC([KFACBlock(curvature_layers(layer)[0], a, g)])
    target = np.array([0.3, -0.2, 0.1, 0.4])
    obj = KFACObjective(target[None], [block], np.ones(1), spec, torch.float64)
    fisher = np.kron(g, a)

    def by_hand(inside):
        w, m, v = np.ones(4), np.zeros(4), np.zeros(4)
        for _ in range(3):
            grad = fisher @ (w - target)
            m, v = grad + 0.9 * m, grad * grad + 0.99 * v
            w = w - 0.01 * m / (np.sqrt(v + 0.01) if inside else np.sqrt(v) + 0.01)
        return w

    w = solve(obj, np.ones(4), 3, ServerOptimizer()).w
    np.testing.assert_allclose(w, by_hand(inside=True), rtol=1e-12)
    assert np.abs(w - by_hand(inside=False)).max() > 100 * np.abs(w - by_hand(inside=True)).max() + 1e-3


def test_selection_scores_every_100_steps_after_the_update_and_keeps_the_earliest_best():
    obj = DiagObjective(np.zeros((1, 1)), np.ones((1, 1)), np.ones(1), dtype=torch.float64)
    seen = []

    def score(w):
        seen.append(float(w[0]))
        return 1.0 if len(seen) in (3, 5) else 0.0

    res = solve(obj, np.ones(1), 2000, ServerOptimizer("gd", lr=1e-3), score=score)
    assert sorted(res.scores) == list(range(0, 2000, 100))
    assert res.best_step == 200
    assert res.w[0] == pytest.approx((1 - 1e-3) ** 201)
