"""Server optimizers (algorithms/fedavg/server_opt.py): each update against a step computed by hand on a
two-parameter example, and each optimizer through the runtime on the quickstart task."""
import numpy as np
import pytest

import raysim
from raysim.algorithms.fedavg.server_opt import ServerOpt

X0 = np.array([1.0, 2.0])
DELTAS = (np.array([0.1, -0.2]), np.array([0.3, 0.0]))  # the pseudo-gradients of rounds 1 and 2


def two_steps(opt: ServerOpt) -> list[np.ndarray]:
    state, out = opt.init(X0), []
    for delta in DELTAS:
        state = opt.step(state, delta)
        out.append(state.params)
    return out


def test_fedavgm_by_hand():
    """η 0.5, β 0.9: m_1 = Δ_1, θ_1 = (1.05, 1.9); m_2 = 0.9 (0.1, -0.2) + (0.3, 0) = (0.39, -0.18), θ_2 = (1.245, 1.81)."""
    first, second = two_steps(ServerOpt("avgm", 0.5, momentum=0.9))
    np.testing.assert_allclose(first, [1.05, 1.9], rtol=0, atol=1e-15)
    np.testing.assert_allclose(second, [1.245, 1.81], rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind, first, second", [
    # m_1 = 0.1 Δ_1 = (0.01, -0.02); v_1 = τ² + Δ_1² = (0.0101, 0.0401): θ_1 = θ_0 + 0.5 m_1 / (√v_1 + 0.01)
    ("adagrad", [1.0452493781056045, 1.952437539013748], [1.1049946169818743, 1.9096313241261214]),
    # v_1 = 0.99 τ² + 0.01 Δ_1² = (1.99e-4, 4.99e-4): θ_1 = 1 + 0.005 / (0.0141067 + 0.01) = 1.2074109
    ("adam", [1.2074109080639335, 1.690769225471462], [1.6596252840996182, 1.4114945330182052]),
    # v_0 = τ² < Δ_1², so v_1 = τ² + 0.01 Δ_1² = (2e-4, 5e-4): θ_1 = 1 + 0.005 / (0.0141421 + 0.01) = 1.2071068
    ("yogi", [1.2071067811865475, 1.6909830056250528], [1.6588486153058501, 1.4128677106876002]),
])
def test_adaptive_steps_by_hand(kind, first, second):
    """Reddi et al. 2021, Alg. 2 with η 0.5, β1 0.9, β2 0.99, τ 0.01 (v_{-1} = τ², no bias correction); the second
    step from m_2 = 0.9 m_1 + 0.1 Δ_2 = (0.039, -0.018) and v_2 by the same rule."""
    got = two_steps(ServerOpt(kind, 0.5, beta1=0.9, beta2=0.99, tau=0.01))
    np.testing.assert_allclose(got[0], first, rtol=1e-14)
    np.testing.assert_allclose(got[1], second, rtol=1e-14)


@pytest.mark.parametrize("name, accuracy", [("fedavgm", 0.95), ("fedadagrad", 0.94), ("fedadam", 0.92), ("fedyogi", 0.94)])
def test_each_reaches_the_quickstart_accuracy(tmp_path, name, accuracy):
    """The quickstart (digits, 100 clients, 10 a round, 60 rounds) with the defaults: FedAvg ends at 0.947;
    measured FedAvgM 0.958, FedAdagrad 0.947, FedAdam 0.928, FedYogi 0.953 (seeds 0-2: FedAvg 0.930-0.967,
    FedAvgM 0.955-0.964, FedAdagrad 0.947-0.972, FedAdam 0.928-0.961, FedYogi 0.936-0.972)."""
    result = raysim.run("configs/fedavg/quickstart.yaml", {"algorithm.name": name}, out=tmp_path / "r", backend="local")
    assert result.rounds["test_accuracy"].iloc[-1] >= accuracy
