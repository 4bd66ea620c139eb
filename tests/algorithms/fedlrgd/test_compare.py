"""`raysim compare` (specs/fedlrgd.md §7.15): F* by Newton against ridge's closed form, the ε-reach table,
FedLRGD on the smooth_ridge source through the runtime (exact estimate = exact GD, Definition 1's Γ,
§7.13's epoch types and oracle calls), and the full FedLRGD-vs-FedAvg comparison (slow)."""
import numpy as np
import pandas as pd
import pytest
import torch

import raysim
from raysim.algorithms.fedlrgd.compare import compare, newton_minimum, optimum, reach
from raysim.config import load_config
from raysim.data import build_federated, read_table_arrays
from raysim.experiment import make_algorithm

RIDGE = "configs/fedlrgd/fedlrgd_vs_fedavg_ridge_fedlrgd.yaml"
LOGISTIC = ["configs/fedlrgd/fedlrgd_vs_fedavg_logistic_fedlrgd.yaml", "configs/fedlrgd/fedlrgd_vs_fedavg_logistic_fedavg.yaml"]


def test_newton_minimum_equals_the_ridge_closed_form(tmp_path):
    """F* of ridge: θ* = (UᵀU/n + μI)^{-1} Uᵀy/n, exact to 1e-12; both families give the same F*."""
    cfg = load_config(RIDGE)
    f_star, n = optimum(cfg, tmp_path / "a")
    u, y = read_table_arrays(tmp_path / "a" / "train.parquet")
    theta = np.linalg.solve(u.T @ u / n + 0.1 * np.eye(3), u.T @ y / n)
    ref = 0.5 * np.mean((u @ theta - y) ** 2) + 0.05 * theta @ theta
    assert n == 1000 and abs(f_star - ref) < 1e-12 * ref
    assert abs(optimum(load_config(RIDGE.replace("fedlrgd.yaml", "fedavg.yaml")), tmp_path / "b")[0] - f_star) < 1e-13


def test_newton_minimum_of_a_logistic_objective():
    x = torch.rand(200, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    y = torch.rand(200, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    f = lambda th: torch.nn.functional.binary_cross_entropy_with_logits(x @ th, y) + 0.05 * th @ th  # noqa: E731
    theta, value = newton_minimum(f, torch.zeros(2))
    assert float(torch.func.grad(f)(theta).norm()) < 1e-13 and value == pytest.approx(float(f(theta)))


def test_reach_takes_the_first_round_within_epsilon():
    rounds = pd.DataFrame({"round": [1, 2, 3, 4], "gamma": [10.0, 20, 30, 40], "sim_time": [1.0, 2, 3, 4],
                           "train_objective": [1.5, 1.01, 1.0005, 1.002]})
    row = reach(rounds, 1.0, 1e-3)
    assert row == {"reached": True, "final_suboptimality": pytest.approx(0.002), "round": 3.0, "gamma": 30.0,
                   "sim_time": 3.0}
    assert not reach(rounds, 0.0, 1e-3)["reached"] and np.isnan(reach(rounds, 0.0, 1e-3)["gamma"])


def test_fedlrgd_on_ridge_source_through_runtime_is_exact_gd(tmp_path):
    """r = p + 1 = 4 on the smooth_ridge source: the run's F(θ_S) equals exact GD's with step 1/L1 (1e-10),
    Γ = r² + r s + r S + φ m r exactly, epochs B, A, C, C, C, B with §7.13's oracle calls."""
    m, s, r, S, phi = 50, 20, 4, 30, 100.0
    result = raysim.run(RIDGE, {"algorithm.S": S, "backend": "local"}, out=tmp_path / "run")
    rounds = result.rounds
    assert rounds["phase"].tolist() == ["B", "A", "C", "C", "C", "B"]
    assert rounds["clients"].tolist() == [0, m, m, m, m, 0]
    assert np.diff(rounds["oracle_calls"], prepend=0).tolist() == [r * r, m * r * s, 0, 0, 0, r * S]
    assert rounds["gamma"].iloc[-1] == r * r + r * s + r * S + phi * m * r == 20216
    assert (rounds["fallback_coords"] == 0).all()
    cfg = load_config(RIDGE, {"algorithm.S": S})
    algo = make_algorithm(cfg, build_federated(cfg.data, cfg.seed, tmp_path / "data"))
    u, y = (torch.as_tensor(np.array(a)) for a in read_table_arrays(tmp_path / "data" / "train.parquet"))
    xs, ys = torch.cat([algo.x0, u]), torch.cat([algo.y0, y])  # FedLRGD's F: server's r samples and the clients'
    theta = torch.zeros(3, dtype=torch.float64)
    for _ in range(S):
        theta = theta - torch.func.grad(lambda th: algo.objective(th, xs, ys))(theta) / 3.1
    assert abs(rounds["train_objective"].iloc[-1] - float(algo.objective(theta, u, y))) < 1e-10


@pytest.mark.slow
def test_fedlrgd_beats_fedavg_on_the_logistic_problem(tmp_path):
    """§7.15 at ε = 1e-3: Γ(FedLRGD) ≤ Γ(best-b FedAvg)/3 (spec: 0.1-0.25), and less simulated time."""
    table = compare(LOGISTIC, 1e-3, tmp_path)
    lrgd = table[table["algorithm"] == "fedlrgd"].iloc[0]
    avg = table[table["algorithm"] == "fedavg"]
    assert lrgd["reached"] and avg["reached"].all() and sorted(avg["b"]) == [1, 5, 10, 20, 50]
    assert lrgd["gamma"] == 16 + 80 + 4 * 14 + 100 * 50 * 4
    assert lrgd["gamma"] <= avg["gamma"].min() / 3
    assert lrgd["sim_time"] < avg["sim_time"].min()
    assert 14 <= avg["rounds"].min() and avg["rounds"].max() <= 20  # spec: T ≈ 16-19 epochs
    assert (tmp_path / "compare.md").exists() and len(pd.read_parquet(tmp_path / "compare.parquet")) == 6
