"""Brute-force Fisher references built from per-sample, per-class autograd gradients (FedFisher, algorithms/fedfisher/README.md)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F


def per_class_gradients(module, x):
    """[n, C, d]: sqrt(p_c(x)) * d log p_c(x) / dW for every sample x and class c, by plain autograd."""
    params = list(module.parameters())
    rows = []
    for xi in x:
        logp = F.log_softmax(module(xi[None]), dim=1)[0]
        per_c = []
        for c in range(len(logp)):
            g = torch.autograd.grad(logp[c], params, retain_graph=True)
            per_c.append(logp[c].exp().detach().sqrt() * torch.cat([t.reshape(-1) for t in g]))
        rows.append(torch.stack(per_c))
    return torch.stack(rows).detach()


def exact_fisher(module, x):
    """The full true Fisher (1/n) sum_x sum_c p_c grad log p_c grad log p_c^T, float64 numpy."""
    g = per_class_gradients(module, x).double().numpy()
    return np.einsum("ncd,nce->de", g, g) / len(x)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
