"""Slow reproductions on the d = 300 quadratic of FZooS, algorithms/fzoos/README.md (Fig. 1's claims, C = 50), driven in process.

Reference (an independent run, one seed): C = 5, gap <= 0.1 after 14 rounds / 7,540 queries (FZooS) against
23 / 24,265 (FedZO with orthonormal FD); at C = 50 the paper-faithful FZooS (gamma = 1/t) diverges,
with exact gradients too, while gamma = 1 ends below every FD baseline.
"""
import pytest
import torch

from raysim.algorithms.fzoos.fedzo import FedZO, ZOFedProx, ZOScaffold1, ZOScaffold2
from raysim.algorithms.fzoos.fzoos import FZooS, correction_length
from raysim.algorithms.fzoos.objectives import Quadratic
from raysim.algorithms.fzoos.optim import LocalOptimizer

FD = dict(fd_directions="orthonormal")  # the official code's directions, scaled d/Q (unbiased; issue 19 A)
OPTIMUM = -0.025 + 0.1 / 300


def trajectory(driver, cls, c, rounds, **params):
    """[(communication round, cumulative queries, F(x_r))] after every completed communication round."""
    make, drive = driver
    algo = make(cls, objective={"dim": 300, "heterogeneity": c}, **params)
    out, queries = [], 0
    for state, phase, costs, server in drive(algo, rounds * len(cls.phases)):
        queries += sum(cost.oracle_calls for cost in costs) + server.oracle_calls
        if state.phase == 0:
            out.append((state.zo_round, queries, algo.objective.value(state.x)))
    return out, algo.objective.optimum


def first_below(traj, optimum, gap):
    """(round, queries) of the first round with F(x_r) - F* <= gap, or (inf, inf)."""
    return next(((r, q) for r, q, f in traj if f - optimum <= gap), (float("inf"), float("inf")))


@pytest.mark.slow
@pytest.mark.parametrize("c,fzoos_rounds", [(0.5, 12), (5.0, 16)])
def test_r1_fzoos_needs_fewer_rounds_and_half_the_queries_of_fedzo(driver, c, fzoos_rounds):
    fz, opt = trajectory(driver, FZooS, c, fzoos_rounds)
    fd, _ = trajectory(driver, FedZO, c, 30, **FD)
    (r_fz, q_fz), (r_fd, q_fd) = first_below(fz, opt, 0.1), first_below(fd, opt, 0.1)
    print(f"C={c}: FZooS {r_fz} rounds / {q_fz} queries, FedZO {r_fd} / {q_fd}")
    assert r_fz < 0.8 * r_fd and q_fz < 0.5 * q_fd


@pytest.mark.slow
def test_r2_r3_r4_fd_baselines(driver):
    """Fig. 1: larger C, more rounds; SCAFFOLD-II beats SCAFFOLD-I by round 50; for C <= 5
    FedProx and SCAFFOLD-I trail FedZO (rounds to gap 0.1)."""
    final, reach = {}, {}
    for c in (0.5, 5.0, 50.0):
        for cls in (FedZO, ZOFedProx, ZOScaffold1, ZOScaffold2):
            traj, opt = trajectory(driver, cls, c, 50, **FD)
            final[cls, c] = traj[-1][2]
            reach[cls, c] = first_below(traj, opt, 0.1)[0]
            print(f"C={c} {cls.name}: F(x_20)={traj[19][2]:.4f} F(x_50)={traj[-1][2]:.4f} "
                  f"rounds to 0.1: {reach[cls, c]}")
    for cls in (FedZO, ZOScaffold1, ZOScaffold2):
        assert reach[cls, 0.5] < reach[cls, 5.0]
        assert final[cls, 5.0] < final[cls, 50.0]
    for c in (0.5, 5.0, 50.0):
        assert final[ZOScaffold2, c] < final[ZOScaffold1, c]
    for c in (0.5, 5.0):
        assert reach[FedZO, c] < reach[ZOScaffold1, c] and reach[FedZO, c] < reach[ZOFedProx, c]


def exact_correction_run(c, gamma, rounds, local_steps=10):
    """F(x_r), r = 0..rounds, of eq. (8) with perfect surrogates: the exact grad f_i(x) + gamma_t (grad F(x) -
    grad f_i(x)) (no correction in round 1), fed to the family's Adam (reset every round, clipped)."""
    q = Quadratic(300, 5, c, seed=0)
    x, values = q.x0.clone(), [q.value(q.x0)]
    for r in range(1, rounds + 1):
        ends = []
        for i in range(5):
            xi, opt = x.clone(), LocalOptimizer("adam", 0.01, clip=True)
            for t in range(1, local_steps + 1):
                g = q.local_grad(i, xi)
                length = correction_length(gamma, t, 1.0, 0.0) if r > 1 else 0.0
                xi = opt.step(xi, g + length * (q.grad(xi) - g))
            ends.append(xi)
        x = torch.stack(ends).mean(0)
        values.append(q.value(x))
    return values


def test_r6_c50_divergence_of_gamma_inv_t_is_the_schedule_not_the_surrogates():
    """C = 50 cause (README): with exact local gradients and an exact correction, gamma = 1/t with Adam still rises
    above F(x_0) at C = 50 (4 of 5 clients are concave in each coordinate and outweigh grad F from step 2 on;
    F(x_20) = 5.53 against F(x_0) = 3.54), so no surrogate defect explains FZooS's divergence; gamma = 1
    follows grad F and reaches the optimum (gap < 0.01), and at C = 5 the 1/t schedule converges (gap < 0.05)."""
    inv_t = exact_correction_run(50.0, "inv_t", 20)
    assert inv_t[-1] > inv_t[0] + 1.0
    assert exact_correction_run(50.0, "const", 20)[-1] - OPTIMUM < 0.01
    assert exact_correction_run(5.0, "inv_t", 20)[-1] - OPTIMUM < 0.05


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [
    "const",
    pytest.param("inv_t", marks=pytest.mark.xfail(strict=True, reason="the paper's 1/t diverges at C = 50 (README)")),
])
def test_r6_c50_fzoos_ends_below_every_fd_baseline(driver, gamma):
    """Fig. 1, C = 50 (paper: FZooS best at every C): F(x_50) of FZooS (M = 10^4) below FedZO, FedProx and
    SCAFFOLD I/II. Holds with gamma = 1, the documented remedy; the paper's gamma = 1/t ends above F(x_0)."""
    fz, _ = trajectory(driver, FZooS, 50.0, 50, gamma=gamma)
    finals = {cls.name: trajectory(driver, cls, 50.0, 50, **FD)[0][-1][2]
              for cls in (FedZO, ZOFedProx, ZOScaffold1, ZOScaffold2)}
    print(f"C=50 F(x_50): FZooS gamma={gamma} {fz[-1][2]:.3f}", {k: round(v, 3) for k, v in finals.items()})
    assert all(fz[-1][2] < v for v in finals.values())


def cosine_profile(driver, cls, **params):
    """Fig. 4: per-step cos(g_hat, grad F) at C = 5, T = 20, averaged over clients and rounds 2-5."""
    make, drive = driver
    algo = make(cls, seed=1, objective={"dim": 300, "heterogeneity": 5.0}, local_steps=20, track_cosine=True,
                **params)
    steps = [s.cosines for s, *_ in drive(algo, 5 * len(cls.phases)) if s.phase == 0 and s.zo_round >= 2]
    per_step = torch.stack(steps).mean(0)
    return per_step, per_step.cumsum(0) / torch.arange(1, 21)


@pytest.mark.slow
def test_fig4_fzoos_gradient_quality_beats_fd_early_in_the_round_and_decays(driver):
    """Fig. 4 analogue: cumulative mean cosine of FZooS above FedZO's for t <= 5 (reference 0.314/0.285
    against 0.152/0.146), and FZooS's per-step quality decays with t."""
    fz, fz_cum = cosine_profile(driver, FZooS)
    _, fd_cum = cosine_profile(driver, FedZO, **FD)
    print("FZooS cumulative t=1/5/10/20", fz_cum[[0, 4, 9, 19]].numpy().round(3),
          "FedZO", fd_cum[[0, 4, 9, 19]].numpy().round(3))
    assert (fz_cum[:5] > fd_cum[:5]).all()
    assert fz[:5].mean() > fz[10:].mean()
