"""The fast diagonal Fisher against the brute-force per-sample, per-class sum of eq. (3)."""
import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher import diagonal_fisher
from raysim.models import ModelConfig, build_model

from .conftest import per_class_gradients


def models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(40, 32, bias=False), nn.ReLU(), nn.Linear(32, 16, bias=False), nn.ReLU(),
                        nn.Linear(16, 10, bias=False))
    lenet = build_model(ModelConfig(name="lenet"), (784,), (1, 28, 28), 10)
    runtime_cnn = build_model(ModelConfig(name="cnn", channels=[4, 6]), (40,), (1, 40), 10)  # Conv1d with biases
    runtime_mlp = build_model(ModelConfig(name="mlp", hidden=[12]), (64,), (1, 8, 8), 10)  # biases
    return {"mlp": (mlp, 40), "lenet": (lenet, 784), "cnn1d": (runtime_cnn, 40), "runtime_mlp": (runtime_mlp, 64)}


@pytest.mark.parametrize("name", ["mlp", "lenet", "cnn1d", "runtime_mlp"])
def test_fast_diagonal_equals_brute_force(name):
    """Relative max error ~1e-6 in float32 (1.9e-6 seen on a bias-free MLP); batches of 7 over 20 samples."""
    module, width = models()[name]
    x = torch.randn(20, width, generator=torch.Generator().manual_seed(1))
    fast = diagonal_fisher(module, x, batch_size=7)
    brute = (per_class_gradients(module, x) ** 2).sum(1).mean(0).numpy()
    assert fast.shape == brute.shape
    assert np.max(np.abs(fast - brute)) / np.max(np.abs(brute)) < 1e-5


def test_diagonal_is_nonnegative_and_an_average_not_a_sum():
    """Duplicating every sample leaves the Fisher unchanged (it does not grow with n)."""
    module, width = models()["mlp"]
    x = torch.randn(16, width, generator=torch.Generator().manual_seed(2))
    once = diagonal_fisher(module, x)
    twice = diagonal_fisher(module, torch.cat([x, x]))
    assert (once >= 0).all()
    np.testing.assert_allclose(twice, once, rtol=1e-5, atol=1e-9)
