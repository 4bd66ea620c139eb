"""fisher_type (FedFisher, algorithms/fedfisher/README.md): the empirical Fisher against per-sample autograd, the Monte Carlo true
Fisher converging to the exact one."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.fedfisher.fisher import FisherEstimate, diagonal_fisher, kfac_fisher

from .conftest import per_class_gradients


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4, bias=False)).double()


def data(n=6):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=gen, dtype=torch.float64), torch.randint(0, 4, (n,), generator=gen)


def test_empirical_diagonal_is_the_mean_squared_gradient_at_the_true_labels():
    module, (x, y) = net(), data()
    rows = []
    for xi, yi in zip(x, y):
        logp = F.log_softmax(module(xi[None]), dim=1)[0, yi]
        rows.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(logp, list(module.parameters()))]))
    brute = (torch.stack(rows) ** 2).mean(0).numpy()
    fast = diagonal_fisher(module, x, 4, FisherEstimate("empirical"), y)
    np.testing.assert_allclose(fast, brute, rtol=1e-10, atol=1e-14)
    exact = (per_class_gradients(module, x) ** 2).sum(1).mean(0).numpy()
    assert np.abs(fast - exact).max() > 0.1 * exact.max()  # not the true Fisher


@pytest.mark.parametrize("compute", ["diag", "kfac"])
def test_monte_carlo_true_fisher_converges_to_the_exact_one(compute):
    """k = 40,000 labels per sample: the relative error of a mean of k i.i.d. terms is ~1/sqrt(k) = 0.5%;
    the tolerance 5% is 10 of those, and 1 label per sample is off by more."""
    module, (x, _) = net(), data()

    def fisher(estimate):
        if compute == "diag":
            return diagonal_fisher(module, x, 6, estimate)
        return np.concatenate([np.kron(b.G, b.A).reshape(-1) for b in kfac_fisher(module, x, 6, estimate).blocks])

    exact = fisher(FisherEstimate())
    many = fisher(FisherEstimate("true_mc", 40_000, torch.Generator().manual_seed(2)))
    one = fisher(FisherEstimate("true_mc", 1, torch.Generator().manual_seed(2)))
    scale = np.abs(exact).max()
    assert np.abs(many - exact).max() < 0.05 * scale
    assert np.abs(one - exact).max() > 0.05 * scale
