"""Synthetic federated objectives against the closed forms of FZooS, algorithms/fzoos/README.md (eq. (98)-(99))."""
import pytest
import torch

from raysim.algorithms.fzoos.objectives import Ackley, Levy, Quadratic


@pytest.mark.parametrize("c", [0.5, 5.0, 50.0])
def test_quadratic_clients_average_exactly_to_eq_99(c):
    """(1/N) sum_i f_i == F of eq. (99) for every C (the Dirichlet weights sum to 1), to 1e-12."""
    q = Quadratic(300, 5, c, seed=1)
    u = torch.rand(7, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mean = torch.stack([q.local(i, u) for i in range(5)]).mean(0)
    x = 20 * u - 10
    closed = ((x * x).sum(1) + x.sum(1) + 1) / (10 * 300)
    assert torch.max(torch.abs(mean - closed)) < 1e-12
    assert abs(q.value(u[0]) - float(closed[0])) < 1e-12


def test_quadratic_optimum_is_spec_value():
    """F* = -0.025 + 0.1/d = -0.0246667 at u = 0.475 (d = 300), where grad F = 0; E F(x0) ~ 3.3337."""
    q = Quadratic(300, 5, 5.0, seed=0)
    u_star = torch.full((300,), 0.475, dtype=torch.float64)
    assert q.optimum == pytest.approx(-0.0246667, abs=1e-7)
    assert q.value(u_star) == pytest.approx(q.optimum, abs=1e-12)
    assert torch.max(torch.abs(q.grad(u_star))) < 1e-12
    u = torch.rand(4000, 300, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mean_f0 = torch.stack([q.local(i, u) for i in range(5)]).mean(0).mean()  # sd of the mean ~0.003
    assert abs(float(mean_f0) - 3.3337) < 0.012


@pytest.mark.parametrize("cls", [Quadratic, Ackley, Levy])
def test_true_gradients_match_central_differences(cls):
    obj = cls(12, 3, 5.0, seed=2)
    u = torch.rand(12, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 0.8 + 0.1
    h = 1e-6
    for i in range(3):
        eye = torch.eye(12, dtype=torch.float64) * h
        fd = (obj.local(i, u + eye) - obj.local(i, u - eye)) / (2 * h)
        assert torch.allclose(obj.local_grad(i, u), fd, rtol=1e-5, atol=1e-7)
    steps = torch.eye(12, dtype=torch.float64) * h
    fd = torch.tensor([(obj.value(u + e) - obj.value(u - e)) / (2 * h) for e in steps], dtype=torch.float64)
    assert torch.allclose(obj.grad(u), fd, rtol=1e-5, atol=1e-7)


def test_same_seed_same_problem_different_seed_different():
    a, b, c = Quadratic(20, 5, 5.0, 4), Quadratic(20, 5, 5.0, 4), Quadratic(20, 5, 5.0, 5)
    assert torch.equal(a.quad, b.quad) and torch.equal(a.x0, b.x0)
    assert not torch.equal(a.quad, c.quad)


def test_levy_is_the_standard_levy_function_with_its_first_term():
    """Levy: g(1, ..., 1) = 0; by hand, z = (-3, 1, 1) gives w = (0, 1, 1) and only the j = 1 term of the sum,
    1 + 10 sin^2(1) = 8.0807342; z = (3, 1) gives w = (1.5, 1): sin^2(1.5 pi) + 0.25 (1 + 10 cos^2(1)) = 1.9798165."""
    levy = Levy(3, 2, 0.0, seed=0)
    z = torch.tensor([[1.0, 1.0, 1.0], [-3.0, 1.0, 1.0], [1.0, 1.0, 5.0]], dtype=torch.float64)
    assert torch.allclose(levy.base(z), torch.tensor([0.0, 8.0807342, 1.0], dtype=torch.float64), atol=1e-7)
    assert float(levy.base(torch.tensor([3.0, 1.0], dtype=torch.float64))) == pytest.approx(1.9798165, abs=1e-7)
    # at C = 0 every client is g(0.1 x) with x = 20u - 10, i.e. z = 2u - 1: u = (0, 1, 1) is z = (-1, 1, 1),
    # w = (0.5, 1, 1): sin^2(pi/2) + 0.25 (1 + 10 cos^2(1)) = 1.9798165; u = 1 is the minimum
    u = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    for i in range(2):
        assert torch.allclose(levy.local(i, u), torch.tensor([1.9798165, 0.0], dtype=torch.float64), atol=1e-7)
