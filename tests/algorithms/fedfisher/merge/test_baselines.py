"""FisherMerge, RegMean and OTFusion against closed forms and invariances (specs/fedfisher.md §4)."""
import numpy as np
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher import curvature_layers
from raysim.algorithms.fedfisher.merge.average import client_weights, weighted_average
from raysim.algorithms.fedfisher.merge.fisher_merge import fisher_merge
from raysim.algorithms.fedfisher.merge.otfusion import otfusion
from raysim.algorithms.fedfisher.merge.regmean import input_grams, linear_layers, regmean
from raysim.models import ModelConfig, ParamSpec, build_model


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


def test_otfusion_undoes_a_hidden_permutation_that_fedavg_cannot():
    torch.manual_seed(1)
    net = build_model(ModelConfig(name="lenet"), (784,), (1, 28, 28), 10).double()
    spec, layers = ParamSpec.of(net), curvature_layers(net)
    w = spec.flatten(dict(net.named_parameters())).detach()
    named = spec.unflatten(w.clone())
    perm_c = torch.randperm(16)
    perm_h = torch.randperm(120)
    permuted = dict(named)
    permuted["4.weight"] = named["4.weight"][perm_c]
    permuted["8.weight"] = named["8.weight"].reshape(120, 16, 16)[:, perm_c].reshape(120, 256)[perm_h]
    permuted["10.weight"] = named["10.weight"][:, perm_h]
    pw = spec.flatten(permuted).numpy()
    x = torch.randn(5, 784, dtype=torch.float64)
    outputs = []
    for v in (w.numpy(), pw):
        torch.nn.utils.vector_to_parameters(torch.as_tensor(v), net.parameters())
        outputs.append(net(x).detach())
    torch.testing.assert_close(outputs[0], outputs[1])  # the same function
    models = np.stack([w.numpy(), pw])
    np.testing.assert_allclose(otfusion(models, np.array([0.4, 0.6]), spec, layers), w.numpy(), atol=1e-12)
    assert np.abs(weighted_average(models, np.array([0.4, 0.6])) - w.numpy()).max() > 1e-2
