"""OTFusion as the paper's code runs it (FedFisher, algorithms/fedfisher/README.md): the correction flags, the aligned output layer,
and validation selection over the flag grid, against closed forms."""
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.func import functional_call

from raysim.algorithms.fedfisher.baselines import OTFusion, OneShotFedAvg
from raysim.algorithms.fedfisher.fisher import curvature_layers
from raysim.algorithms.fedfisher.otfusion import EPS, FLAGS, flag_grid, fuse, otfusion
from raysim.contract import ClientData, Context
from raysim.core.rng import stream
from raysim.models import ModelConfig, ParamSpec, build_model

WIDTHS = (12, 8, 10)  # mlp_nobias 64-12-8-10: the out-widths n_l of its three layers


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(name="mlp_nobias", hidden=list(WIDTHS[:2])), (64,), None, 10).double()


@pytest.mark.parametrize("correction, past", FLAGS)
def test_identical_models_are_scaled_as_the_reference_code_scales_them(correction, past):
    """All clients equal W: every plan is the identity / n_l, so fused_l = s_l (s_{l-1} if past) W_l with
    s_l = 1/(1 + n_l eps) under `correction` and 1/n_l without it; the merge is p_0 W + (1 − p_0) fused."""
    net = mlp()
    spec, layers = ParamSpec.of(net), curvature_layers(net)
    w = spec.flatten(dict(net.named_parameters())).detach()
    named = spec.unflatten(w.clone())
    s = [1 / (1 + n * EPS) if correction else 1 / n for n in WIDTHS]
    expect = {}
    for l, layer in enumerate(layers):
        scale = s[l] * (s[l - 1] if past and l > 0 else 1.0)
        expect[layer.weight] = scale * named[layer.weight]
    p = np.array([0.2, 0.5, 0.3])
    merged = otfusion(np.stack([w.numpy()] * 3), p, spec, layers, correction, past)
    np.testing.assert_allclose(merged, 0.2 * w.numpy() + 0.8 * spec.flatten(expect).numpy(), rtol=1e-12, atol=1e-15)


def test_the_output_layer_is_aligned_too():
    """skip_last_layer False: a model whose classes are the pivot's rows permuted is transported onto the pivot."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(6, 4, bias=False)).double()
    spec, layers = ParamSpec.of(net), curvature_layers(net)
    pivot = net[0].weight.detach().clone()
    model = pivot[torch.tensor([2, 0, 3, 1])]
    fused = fuse({"0.weight": model}, {"0.weight": pivot}, layers, correction=True, past_correction=True)
    torch.testing.assert_close(fused["0.weight"], pivot / (1 + 4 * EPS), rtol=1e-14, atol=0.0)


def test_a_hidden_permutation_is_undone_with_both_corrections():
    torch.manual_seed(1)
    net = build_model(ModelConfig(name="lenet"), (784,), (1, 28, 28), 10).double()
    spec, layers = ParamSpec.of(net), curvature_layers(net)
    w = spec.flatten(dict(net.named_parameters())).detach()
    named = spec.unflatten(w.clone())
    perm_c, perm_h = torch.randperm(16), torch.randperm(120)
    permuted = dict(named)
    permuted["4.weight"] = named["4.weight"][perm_c]
    permuted["8.weight"] = named["8.weight"].reshape(120, 16, 16)[:, perm_c].reshape(120, 256)[perm_h]
    permuted["10.weight"] = named["10.weight"][:, perm_h]
    fused = fuse(permuted, named, layers, correction=True, past_correction=True)
    for layer, n_in in zip(layers, (1, 6, 16, 120, 84)):  # each layer: its own plan's and its input plan's mass
        scale = (1 / (1 + len(named[layer.weight]) * EPS)) * (1 / (1 + n_in * EPS) if n_in > 1 else 1.0)
        torch.testing.assert_close(fused[layer.weight], scale * named[layer.weight], rtol=1e-12, atol=1e-15)


@pytest.fixture(scope="module")
def trained():
    """Three clients trained 5 epochs from one W0 on random thirds of 1,500 digits, and a 297-sample held-out set."""
    x, y = load_digits(return_X_y=True)
    x, y = torch.as_tensor(x / 16.0), torch.as_tensor(y)
    ctx = Context(seed=3, rounds=1, clients_per_round=3, num_clients=3, client_sizes=np.ones(3), feature_shape=(64,),
                  image_shape=(1, 8, 8), num_classes=10, model=ModelConfig(name="mlp_nobias", hidden=[32, 16],
                                                                           dtype="float64"),
                  params=OTFusion.Params(local_epochs=5, lr=0.05))
    algo = OTFusion(ctx)
    w0 = algo.init().params
    parts = np.array_split(np.random.default_rng(0).permutation(1500), 3)
    models = np.stack([algo.step(None, ClientData(i, x[p], y[p]), w0, stream(0, 1, i, "s"))[0].params
                       for i, p in enumerate(parts)])
    return algo, models, x[1500:], y[1500:]


def test_from_a_shared_initialization_the_flags_change_the_merge(trained):
    """Here every plan is the identity (the models share W0), so with `correction` the merge is FedAvg up to the
    1 + n eps factors, and without it the transported models shrink by 1/n_l: far from FedAvg."""
    algo, models, _, _ = trained
    p = np.array([0.5, 0.3, 0.2])
    fedavg = p @ models
    scale = np.abs(fedavg).max()
    for (correction, past), merged in zip(FLAGS, flag_grid(models, p, algo.spec, curvature_layers(algo.module))):
        gap = np.abs(merged - fedavg).max() / scale
        assert (1e-8 < gap < 1e-4) if correction else (gap > 0.3), (correction, past, gap)


def test_the_flags_are_chosen_on_the_validation_set(trained, monkeypatch):
    algo, models, x_val, y_val = trained
    monkeypatch.setattr(OTFusion, "validation", (x_val, y_val))
    p = np.array([0.5, 0.3, 0.2])

    def accuracy(v):
        with torch.no_grad():
            out = functional_call(algo.module, algo.spec.unflatten(torch.as_tensor(v)), (x_val,))
        return float((out.argmax(1) == y_val).double().mean())

    candidates = list(flag_grid(models, p, algo.spec, curvature_layers(algo.module)))
    scores = [accuracy(c) for c in candidates]
    assert len(set(scores)) > 1  # the choice matters here
    merged, cost = algo.merge(models, None, p)
    np.testing.assert_array_equal(merged, candidates[int(np.argmax(scores))])
    assert cost.oracle_calls == 4 * len(y_val)
    fedavg = OneShotFedAvg.merge(algo, models, None, p)[0]
    assert accuracy(merged) > accuracy(fedavg)
