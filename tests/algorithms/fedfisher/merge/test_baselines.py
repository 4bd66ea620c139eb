"""FisherMerge and RegMean against closed forms and invariances (FedFisher, algorithms/fedfisher/README.md)."""
import numpy as np
import torch
from torch import nn

from raysim.algorithms.fedfisher.merge.average import client_weights
from raysim.algorithms.fedfisher.merge.fisher_merge import fisher_merge
from raysim.algorithms.fedfisher.merge.regmean import input_grams, linear_layers, regmean
from raysim.models import ParamSpec


def test_fisher_merge_closed_form_and_fallback():
    models = np.array([[1.0, 2.0, 3.0], [3.0, 6.0, 5.0]])
    fishers = np.array([[1.0, 0.0, 0.0], [3.0, 2.0, 0.0]])
    p = client_weights([1, 3])
    merged = fisher_merge(models, fishers, p)
    expect0 = (0.25 * 1 * 1 + 0.75 * 3 * 3) / (0.25 * 1 + 0.75 * 3)
    np.testing.assert_allclose(merged, [expect0, 6.0, 0.25 * 3 + 0.75 * 5])


def test_regmean_is_the_least_squares_merge_of_a_linear_layer():
    """alpha = 1: W solves min_W Σ_i p_i ‖X_i W^T − X_i W_i^T‖² (Jin et al.'s derivation)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 3, bias=False)).double()
    spec, layers = ParamSpec.of(net), linear_layers(net)
    rng = np.random.default_rng(0)
    xs = [torch.as_tensor(rng.standard_normal((n, 6))) for n in (20, 35)]
    models = rng.standard_normal((2, 18))
    grams = []
    for m, x in zip(models, xs):
        torch.nn.utils.vector_to_parameters(torch.as_tensor(m), net.parameters())
        grams.append(input_grams(net, x, batch_size=7))
    p = np.array([0.3, 0.7])
    merged = regmean(models, grams, p, layers, spec, alpha=1.0)
    stacked_x = np.concatenate([np.sqrt(pi / len(x)) * x.numpy() for pi, x in zip(p, xs)])
    stacked_y = np.concatenate([np.sqrt(pi / len(x)) * x.numpy() @ m.reshape(3, 6).T for pi, x, m in zip(p, xs, models)])
    lsq = np.linalg.lstsq(stacked_x, stacked_y, rcond=None)[0].T
    np.testing.assert_allclose(merged, lsq.reshape(-1), atol=1e-10)
