"""The diagonal fallback of FedFisher, algorithms/fedfisher/README.md: parameters outside Linear/Conv layers (BatchNorm, LayerNorm, a
free parameter) get the diagonal Fisher, in eval mode, equal to a per-sample autograd loop for every fisher_type."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysim.algorithms.fedfisher.fisher import (FisherEstimate, curvature_layers, diagonal_fisher, fisher_partition,
                                               kfac_fisher)
from raysim.models import ParamSpec

REST = ["scale", "bn.weight", "bn.bias", "ln.weight", "ln.bias"]


class NormNet(nn.Module):
    """Linear -> BatchNorm -> tanh -> LayerNorm -> bias-free Linear, times a free per-class parameter."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.ln, self.fc2 = nn.Linear(6, 5), nn.BatchNorm1d(5), nn.LayerNorm(5), nn.Linear(5, 4, bias=False)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 4))

    def forward(self, x):
        return self.fc2(self.ln(torch.tanh(self.bn(self.fc1(x))))) * self.scale


def net():
    """NormNet in float64 with perturbed normalization parameters and running statistics away from (0, 1), left in
    train mode."""
    torch.manual_seed(0)
    module = NormNet().double()
    with torch.no_grad():
        for name in REST[1:]:
            module.get_parameter(name).add_(0.3 * torch.randn(5, dtype=torch.float64))
        module(3.0 * torch.randn(50, 6, dtype=torch.float64) + 1.0)  # train mode: updates the running statistics
    return module


def data(n=7):
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=gen, dtype=torch.float64), torch.randint(0, 4, (n,), generator=gen)


def per_sample_diagonal(module, x, coef):
    """(1/n) sum_x sum_c coef[x, c] (d log p_c(x) / dW)^2 by autograd, one sample at a time in eval mode, in
    ParamSpec order."""
    module.eval()
    params = list(module.parameters())
    total = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    for xi, ci in zip(x, coef):
        logp = F.log_softmax(module(xi[None]), dim=1)[0]
        for c in range(len(logp)):
            g = torch.autograd.grad(logp[c], params, retain_graph=True)
            total += ci[c] * torch.cat([t.reshape(-1) for t in g]) ** 2
    module.train()
    return (total / len(x)).numpy()


def probabilities(module, x):
    module.eval()
    with torch.no_grad():
        p = F.softmax(module(x), dim=1)
    module.train()
    return p


@pytest.mark.parametrize("kind", ["true_exact", "empirical", "true_mc_2", "true_mc_7"])
def test_fallback_diagonal_equals_a_per_sample_autograd_loop(kind):
    """The whole diagonal (Linear layers and fallback) against the loop, with the class weights of each estimate:
    p_c (true_exact), the label (empirical), the share of k labels drawn from p (true_mc; k = 2 < C one-hot outputs,
    k = 7 ≥ C class counts; one batch, so the same draws from the same generator)."""
    module, (x, y) = net(), data()
    if kind == "true_exact":
        estimate, coef = FisherEstimate(), probabilities(module, x)
    elif kind == "empirical":
        estimate, coef = FisherEstimate("empirical"), F.one_hot(y, 4).double()
    else:
        k = int(kind.rsplit("_", 1)[1])
        estimate = FisherEstimate("true_mc", k, torch.Generator().manual_seed(5))
        draws = torch.multinomial(probabilities(module, x), k, replacement=True, generator=torch.Generator().manual_seed(5))
        coef = F.one_hot(draws, 4).double().sum(1) / k
    brute = per_sample_diagonal(module, x, coef)
    fast = diagonal_fisher(module, x, len(x), estimate, y)
    assert module.training  # restored after the eval-mode pass
    np.testing.assert_allclose(fast, brute, rtol=1e-10, atol=1e-14)
    rest = ParamSpec.of(module).unflatten(torch.as_tensor(brute))
    assert all(rest[n].abs().min() > 1e-6 for n in REST)  # every fallback entry is tested, none is trivially 0


def test_kfac_carries_the_same_diagonal_for_parameters_outside_its_layers():
    """K-FAC's factors cover fc1 (with its bias) and fc2; the other five tensors get diagonal_fisher's entries, over
    batches of 3 (7 samples: a ragged last batch), counted in the upload's floats."""
    module, (x, _) = net(), data()
    layers, rest = fisher_partition(module)
    assert [l.name for l in layers] == ["fc1", "fc2"] and rest == REST
    kfac = kfac_fisher(module, x, 3)
    diag = ParamSpec.of(module).unflatten(torch.as_tensor(diagonal_fisher(module, x, 3)))
    assert list(kfac.diagonal) == REST
    for name in REST:
        np.testing.assert_allclose(kfac.diagonal[name], diag[name].numpy(), rtol=1e-12, atol=1e-15)
    assert kfac.floats == 7**2 + 5**2 + 5**2 + 4**2 + 4 + 4 * 5


def test_the_layer_by_layer_methods_still_refuse_parameters_outside_the_layers():
    """OTFusion, PFNM and RegMean take `curvature_layers`, which names the uncovered parameters in one line."""
    with pytest.raises(ValueError, match=r"parameters \['scale', 'bn.weight', 'bn.bias', 'ln.weight', 'ln.bias'\] are "
                                         r"not in a Linear/Conv1d/Conv2d layer: this method works layer by layer"):
        curvature_layers(net())
