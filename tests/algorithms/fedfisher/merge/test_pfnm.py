"""PFNM against brute force, permutation invariance and hand-computable merges (FedFisher, algorithms/fedfisher/README.md)."""
import copy
import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher import curvature_layers
from raysim.algorithms.fedfisher.merge.pfnm import Atoms, PFNMPrior, class_weights, match_client, pfnm, widen
from raysim.models import ModelConfig, ParamSpec, build_model

# Low noise (σ → 0) with a tight prior: PFNM becomes exact matching plus averaging, the prior's pull on
# the means is ~1e-10, and merging an identical neuron gains ~|w|²/σ0 >> the BBP prior's log-odds.
EXACT = PFNMPrior(sigma=1e-10, sigma0=1e-2)
# No neuron is ever matched (new atoms cost nothing) and the prior is flat: the global model is the
# concatenation of the local ones.
DISJOINT = PFNMPrior(sigma=1.0, sigma0=1e12, gamma=1e30)


def flat(net: nn.Module) -> np.ndarray:
    return ParamSpec.of(net).flatten(dict(net.named_parameters())).detach().numpy()


def outputs(template: nn.Module, params: np.ndarray, widths, x: torch.Tensor) -> torch.Tensor:
    net = widen(template, tuple(widths)) if widths is not None else template
    torch.nn.utils.vector_to_parameters(torch.as_tensor(params), net.parameters())
    with torch.no_grad():
        return net(x)


def permuted(net: nn.Module, rng: np.random.Generator) -> np.ndarray:
    """`net`'s parameters with every hidden layer's units (conv channels) randomly permuted: the same function."""
    layers = curvature_layers(net)
    named = {k: v.detach().clone() for k, v in net.named_parameters()}
    for k in range(len(layers) - 1):
        layer, nxt = layers[k], layers[k + 1]
        perm = torch.as_tensor(rng.permutation(layer.out_dim))
        named[layer.weight] = named[layer.weight][perm]
        if layer.bias:
            named[layer.bias] = named[layer.bias][perm]
        w = named[nxt.weight]
        named[nxt.weight] = w.reshape(w.shape[0], layer.out_dim, -1)[:, perm].reshape(w.shape)
    return ParamSpec.of(net).flatten(named).numpy()


def reinitialized(net: nn.Module, seed: int) -> np.ndarray:
    """The flat parameters of a copy of `net` freshly initialized (PyTorch's default) under `seed`."""
    net = copy.deepcopy(net)
    torch.manual_seed(seed)
    for m in net.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            m.reset_parameters()
    return flat(net)


def model(name: str, **cfg) -> nn.Module:
    feature, image = {"lenet": ((784,), (1, 28, 28)), "cnn": ((40,), (1, 40))}.get(name, ((64,), None))
    torch.manual_seed(0)
    return build_model(ModelConfig(name=name, dtype="float64", **cfg), feature, image, 10)


def inputs(net_name: str, n: int = 7) -> torch.Tensor:
    return torch.randn(n, {"lenet": 784, "cnn": 40}.get(net_name, 64), dtype=torch.float64)


@pytest.mark.parametrize("name", ["mlp_nobias", "lenet"])
def test_identical_clients_give_back_their_model(name):
    net = model(name, hidden=[12, 8])
    w = flat(net)
    counts = np.random.default_rng(0).integers(0, 50, (3, 10))
    merged, widths = pfnm(np.stack([w] * 3), counts, np.ones(3) / 3, net, EXACT, np.random.default_rng(0))
    assert list(widths) == [l.out_dim for l in curvature_layers(net)[:-1]]
    x = inputs(name)
    torch.testing.assert_close(outputs(net, merged, widths, x), outputs(net, w, None, x), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["mlp", "lenet", "cnn"])
def test_permuted_clients_are_matched_back(name):
    """Clients that are hidden-unit permutations of one model: PFNM recovers it, no wider; FedAvg would not."""
    net = model(name, hidden=[16, 8], channels=[6, 5])
    rng = np.random.default_rng(1)
    models = np.stack([flat(net)] + [permuted(net, rng) for _ in range(3)])
    x = inputs(name)
    ref = outputs(net, models[0], None, x)
    torch.testing.assert_close(outputs(net, models[2], None, x), ref)  # a permutation is the same function
    merged, widths = pfnm(models, np.ones((4, 10)), np.ones(4) / 4, net, EXACT, np.random.default_rng(2))
    assert list(widths) == [l.out_dim for l in curvature_layers(net)[:-1]]
    torch.testing.assert_close(outputs(net, merged, widths, x), ref, atol=1e-6, rtol=1e-6)
    assert (outputs(net, models.mean(0), None, x) - ref).abs().max() > 1e-2


def objective(w, members, choice, prior, J):
    """The MAP objective of client j's assignment (PFNM §3.1) from scratch: max over θ of the log joint
    (×2, up to constants) of every atom and the neurons assigned to it, plus the BBP prior of B^j given
    the others: Σ_matched log(m_i/(J - m_i)) (weight 1, as the reference code) + 2 k log(γ/J) - 2 log k!."""
    p, p0 = 1 / prior.sigma, 1 / prior.sigma0
    mu0 = np.zeros(w.shape[1])
    mu0[-1] = 0.1
    atoms = [list(m) for m in members] + [[w[l]] for l, c in enumerate(choice) if c is None]
    for l, c in enumerate(choice):
        if c is not None:
            atoms[c].append(w[l])
    total = 0.0
    for vs in atoms:
        theta = (p0 * mu0 + p * np.sum(vs, 0)) / (p0 + p * len(vs))
        total -= p0 * ((theta - mu0) ** 2).sum() + p * sum(((v - theta) ** 2).sum() for v in vs)
    k = sum(c is None for c in choice)
    total += sum(math.log(len(members[c]) / (J - len(members[c]))) for c in choice if c is not None)
    return total + 2 * k * math.log(prior.gamma / J) - 2 * math.log(math.factorial(k))


@pytest.mark.parametrize("seed", range(12))
def test_bbp_map_assignment_is_the_brute_force_map(seed):
    rng = np.random.default_rng(seed)
    prior = PFNMPrior(sigma=rng.choice([0.05, 0.3, 1.0]), sigma0=1.0, gamma=7.0)
    J, D = 4, 3
    centers = rng.normal(0, 2, (3, D))
    members = [[c + rng.normal(0, 0.3, D) for _ in range(m)] for c, m in zip(centers, (1, 2, 3))]
    near = [centers[rng.integers(3)] + rng.normal(0, 0.5, D) for _ in range(2)]
    w = np.vstack(near + [rng.normal(0, 2, D)])  # two neurons near atoms, one anywhere
    p, p0 = 1 / prior.sigma, 1 / prior.sigma0
    mu0 = np.array([0, 0, 0.1])
    atoms = Atoms(np.array([p0 * mu0 + p * np.sum(m, 0) for m in members]),
                  np.array([p0 + p * len(m) for m in members]), np.array([len(m) for m in members]))
    _, assign = match_client(w, atoms, prior, J)
    got = tuple(int(a) if a < 3 else None for a in assign)
    choices = [c for c in itertools.product([0, 1, 2, None], repeat=3)
               if len([a for a in c if a is not None]) == len({a for a in c if a is not None})]
    scores = {c: objective(w, members, c, prior, J) for c in choices}
    best = max(scores, key=scores.get)
    assert got == best, (got, best, scores[got], scores[best])


def test_output_layer_is_averaged_with_class_count_weights():
    counts = np.array([[3, 0, 5], [1, 0, 0]])
    np.testing.assert_allclose(class_weights(counts, np.array([0.6, 0.4])), [[0.75, 0.6, 1.0], [0.25, 0.4, 0.0]])


def test_default_prior_merges_by_hand():
    """Two clients sharing one hidden unit w = (6, 8) (|w|² = 100 makes merging win under σ = σ0 = 1, γ = 7):
    the atom is the posterior mean (0 + w + w)/(1 + 2) with bias (0.1 + 0 + 0)/3, and the output rows are
    averaged with weights n_jc/Σ_j n_jc."""
    net = nn.Sequential(nn.Linear(2, 1, bias=False), nn.ReLU(), nn.Linear(1, 2, bias=False)).double()
    v1, v2 = np.array([1.0, -2.0]), np.array([3.0, 0.5])
    models = np.stack([np.r_[6.0, 8.0, v1], np.r_[6.0, 8.0, v2]])
    counts = np.array([[10, 30], [30, 10]])
    merged, widths = pfnm(models, counts, np.array([0.5, 0.5]), net, PFNMPrior(), np.random.default_rng(0))
    assert widths == (1,)
    x = torch.tensor([[0.5, -0.1], [1.0, 2.0]], dtype=torch.float64)
    h = torch.relu(x @ torch.tensor([4.0, 16 / 3], dtype=torch.float64) + 1 / 30)
    out = torch.stack([h * (0.25 * 1 + 0.75 * 3), h * (0.75 * -2 + 0.25 * 0.5)], 1)
    torch.testing.assert_close(outputs(net, merged, widths, x), out)


@pytest.mark.parametrize("name", ["mlp_nobias", "lenet", "cnn"])
def test_unmatched_neurons_make_the_class_weighted_ensemble(name):
    """When no neuron is merged the global model is all local units side by side, and its logits are
    Σ_j a_jc f_j(x)_c: the widened forward pass of MLP, LeNet (flatten blocks) and the small 1-D CNN."""
    net = model(name, hidden=[12, 8], channels=[4, 6])
    models = np.stack([reinitialized(net, 10 + s) for s in range(2)])
    counts = np.array([[5, 0, 2, 9, 1, 1, 0, 3, 4, 2], [1, 7, 2, 0, 1, 3, 0, 3, 0, 8]])
    merged, widths = pfnm(models, counts, np.array([0.5, 0.5]), net, DISJOINT, np.random.default_rng(0))
    assert list(widths) == [2 * l.out_dim for l in curvature_layers(net)[:-1]]
    a = torch.as_tensor(class_weights(counts, np.array([0.5, 0.5])))
    x = inputs(name)
    expect = sum(a[j] * outputs(net, models[j], None, x) for j in range(2))
    torch.testing.assert_close(outputs(net, merged, widths, x), expect, atol=1e-6, rtol=1e-6)


def test_widen_refuses_wrong_widths():
    with pytest.raises(ValueError, match="widths"):
        widen(model("lenet"), (6, 16))
