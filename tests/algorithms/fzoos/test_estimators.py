"""The FD estimator of eq. (3) (specs/fzoos.md §3.1, U7)."""
import math

import numpy as np
import pytest
import torch

from raysim.algorithms.fzoos.estimators import directions, fd_gradient
from raysim.algorithms.fzoos.objectives import Quadratic


@pytest.fixture(scope="module")
def problem():
    q = Quadratic(300, 5, 5.0, seed=0)
    return q, q.x0, q.local_grad(0, q.x0)


@pytest.mark.parametrize("kind", ["gaussian", "orthonormal"])
def test_cosine_is_sqrt_q_over_d(problem, kind):
    """U7: cos(Delta, grad f) ~ sqrt(Q/d) = 0.258 (Q = 20, d = 300; spec: 0.248 Gaussian, 0.265 orthonormal)."""
    q, x, true = problem
    rng = np.random.default_rng(1)
    fx = q.local(0, x[None])[0]
    cos = [float(torch.nn.functional.cosine_similarity(
        fd_gradient(lambda u: q.local(0, u), x, fx, directions(300, 20, kind, rng), 0.01, "inv_q"), true, dim=0))
        for _ in range(100)]
    assert abs(np.mean(cos) - math.sqrt(20 / 300)) < 0.03


def test_gaussian_estimate_is_unbiased(problem):
    """U7: the mean of n Gaussian estimates (scale 1/Q) approaches grad f: relative error ~sqrt(d/(Qn)),
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


def test_orthonormal_directions_and_the_d_over_q_scale():
    rng = np.random.default_rng(3)
    """Orthonormal unit directions; with scale d/Q their mean estimate is unbiased (error ~sqrt((d/Q - 1)/n))."""
    U = directions(20, 10, "orthonormal", rng)
    assert torch.allclose(U @ U.T, torch.eye(10, dtype=torch.float64), atol=1e-12)
    g = torch.linspace(-1, 1, 20, dtype=torch.float64)
    linear = lambda u: u @ g  # noqa: E731  (FD is exact on it)
    x = torch.zeros(20, dtype=torch.float64)
    mean = sum(fd_gradient(linear, x, linear(x[None])[0], directions(20, 10, "orthonormal", rng), 0.01, "d_over_q")
               for _ in range(400)) / 400
    assert float(torch.norm(mean - g) / torch.norm(g)) < 0.15
