"""The FD estimator of eq. (3) (FZooS, algorithms/fzoos/README.md; Lemma D.1)."""
import math

import numpy as np
import pytest
import torch

from raysim.algorithms.fzoos.estimators import directions, fd_gradient
from raysim.algorithms.fzoos.fedzo import FedZO
from raysim.algorithms.fzoos.objectives import Quadratic


@pytest.fixture(scope="module")
def problem():
    q = Quadratic(300, 5, 5.0, seed=0)
    return q, q.x0, q.local_grad(0, q.x0)


@pytest.mark.parametrize("kind", ["gaussian", "orthonormal"])
def test_cosine_is_sqrt_q_over_d(problem, kind):
    """cos(Delta, grad f) ~ sqrt(Q/d) = 0.258 (Q = 20, d = 300; reference: 0.248 Gaussian, 0.265 orthonormal)."""
    q, x, true = problem
    rng = np.random.default_rng(1)
    fx = q.local(0, x[None])[0]
    cos = [float(torch.nn.functional.cosine_similarity(
        fd_gradient(lambda u: q.local(0, u), x, fx, directions(300, 20, kind, rng), 0.01, "inv_q"), true, dim=0))
        for _ in range(100)]
    assert abs(np.mean(cos) - math.sqrt(20 / 300)) < 0.03


def test_gaussian_estimate_is_unbiased(problem):
    """The mean of n Gaussian estimates (scale 1/Q) approaches grad f: relative error ~sqrt(d/(Qn)),
    below 0.1 at n = 8000."""
    q, x, true = problem
    rng = np.random.default_rng(2)
    fx = q.local(0, x[None])[0]
    total, errs = torch.zeros(300, dtype=torch.float64), {}
    for n in range(1, 8001):
        total += fd_gradient(lambda u: q.local(0, u), x, fx, directions(300, 20, "gaussian", rng), 0.01, "inv_q")
        if n in (500, 8000):
            errs[n] = float(torch.norm(total / n - true) / torch.norm(true))
    assert errs[8000] < errs[500] and errs[8000] < 0.1


def test_orthonormal_directions_are_orthonormal():
    U = directions(20, 10, "orthonormal", np.random.default_rng(3))
    assert torch.allclose(U @ U.T, torch.eye(10, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("kind", ["gaussian", "orthonormal"])
def test_fedzo_default_scale_is_unbiased_on_the_quadratic(driver, kind):
    """Issue 19 A, eq. (3): with FedZO's default scale the mean of n = 2000 estimates of grad f_0(x_0) on the
    C = 5 quadratic (d = 300, Q = 20) is grad f_0 (exactly unbiased on a quadratic: the curvature term is
    odd in u). Relative error ~ sqrt((d/Q - 1)/n) = 0.084 (orthonormal, 0.09 Gaussian); tolerance 0.15.
    The code's 1/Q with unit directions has mean grad f / d: error 1 - 1/d = 0.997."""
    make, _ = driver
    algo = make(FedZO, objective={"dim": 300, "heterogeneity": 5.0}, fd_directions=kind)
    x = algo.objective.x0
    true, fx = algo.objective.local_grad(0, x), algo.objective.local(0, x[None])[0]
    rng = np.random.default_rng(4)
    mean = sum(algo._fd(0, x, fx, rng) for _ in range(2000)) / 2000
    assert float(torch.norm(mean - true) / torch.norm(true)) < 0.15
