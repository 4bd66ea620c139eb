"""Appendix C's approximate-rank measurement (FedLRGD, algorithms/fedlrgd/README.md): the rank of known matrices and of a
model whose per-sample gradients have exact rank 2 in the data, the paper's parameter counts, the
dataset readers, and the digits pipeline through raysim (train, measure, `raysim report` histogram)."""
import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from raysim.models import ModelConfig, ParamSpec, build_model
from raysim.algorithms.fedlrgd.rank import (approximate_rank, cross_entropy_loss, gradient_tensor, load_cifar10, load_mnist,
                         measure_ranks, perturbed_parameters, rank_run, read_idx, summarize, train_centralized)
from raysim.core.rng import torch_stream

F64 = torch.float64


def test_approximate_rank_of_known_singular_values():
    """(77): energies 9, 4, 1 of 14: 90% needs 13 >= 12.6, so J = 2; 99.9% needs all 3; zero matrix -> 0."""
    q = torch.linalg.qr(torch.randn(3, 3, dtype=F64, generator=torch.Generator().manual_seed(0)))[0]
    M = q @ torch.diag(torch.tensor([3.0, 2.0, 1.0], dtype=F64)) @ q.T
    assert approximate_rank(M).item() == 2
    assert approximate_rank(M, 0.999).item() == 3
    assert approximate_rank(M, 9 / 14 - 1e-9).item() == 1
    assert approximate_rank(torch.zeros(2, 4, 4)).tolist() == [0, 0]


def linear_sq(theta, x, y):
    """f = ½(θ₀x + θ₁ − y)²: ∂f/∂θ₀ = θ₀x² + θ₁x − yx, ∂f/∂θ₁ = θ₀x + θ₁ − y."""
    return 0.5 * (theta[0] * x[0] + theta[1] - y) ** 2


def test_gradient_tensor_entries_and_exact_rank_two():
    """With y = 0 each coordinate's kernel is spanned by two functions of x ({x², x}, {x, 1}): rank exactly 2."""
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(12, 1, dtype=F64, generator=gen)
    thetas = torch.randn(12, 2, dtype=F64, generator=gen)
    M = gradient_tensor(linear_sq, thetas, x, torch.zeros(12, dtype=F64), torch.tensor([0, 1]))
    assert M.shape == (2, 12, 12)
    xi, t0, t1 = x[:, 0, None], thetas[None, :, 0], thetas[None, :, 1]
    assert torch.allclose(M[0], t0 * xi**2 + t1 * xi) and torch.allclose(M[1], t0 * xi + t1)
    assert approximate_rank(M, 1 - 1e-10).tolist() == [2, 2]
    y = torch.rand(12, dtype=F64, generator=gen)  # a third function (y x, y) enters: rank 3
    assert approximate_rank(gradient_tensor(linear_sq, thetas, x, y, torch.tensor([0, 1])), 1 - 1e-10).tolist() == [3, 3]


def test_measure_ranks_pipeline_on_a_known_rank_model():
    x = torch.rand(50, 1, dtype=F64, generator=torch.Generator().manual_seed(2))
    table = measure_ranks(linear_sq, torch.tensor([0.7, -0.3], dtype=F64), x, torch.zeros(50, dtype=F64), k=20,
                          seed=0, energy=1 - 1e-10)
    assert table["coord"].tolist() == [0, 1] and table["rank"].tolist() == [2, 2] and (table["k"] == 20).all()
    s = summarize(table["rank"].to_numpy(), 20)
    assert s.share_le_5 == 1.0 and s.median == 2 and s.max == 2


def test_perturbations_have_the_mean_absolute_weight_as_scale():
    """(75): θ^(j) = θ* + (‖θ*‖₁/p) g_j: the deviations have standard deviation ‖θ*‖₁/p."""
    theta = torch.tensor([2.0, -1.0, 0.0, 1.0], dtype=F64)
    thetas = perturbed_parameters(theta, 20000, torch_stream(0, 0, 0, "t"))
    assert thetas.shape == (20000, 4)
    assert abs(float((thetas - theta).std()) - 1.0) < 0.02  # ‖θ‖₁/p = 4/4


def test_paper_parameter_counts():
    """App. C: MNIST MLP with K = 784 has 623,290 weights; the CIFAR-10 CNN 1,553,220."""
    mlp = build_model(ModelConfig(name="sigmoid_mlp", hidden=[784]), (784,), None, 10)
    cnn = build_model(ModelConfig(name="sigmoid_cnn", channels=[40, 40], hidden=[150]), (3072,), (3, 32, 32), 10)
    assert ParamSpec.of(mlp).size == 623_290
    assert ParamSpec.of(cnn).size == 1_553_220
    assert cnn(torch.zeros(2, 3072)).shape == (2, 10)


def test_idx_and_cifar_readers(tmp_path):
    images = np.arange(2 * 28 * 28, dtype=np.uint32).reshape(2, 28, 28) % 256
    header = bytes([0, 0, 8, 3]) + b"".join(int(v).to_bytes(4, "big") for v in (2, 28, 28))
    with gzip.open(tmp_path / "train-images-idx3-ubyte.gz", "wb") as f:
        f.write(header + images.astype(np.uint8).tobytes())
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + (2).to_bytes(4, "big") + bytes([7, 3]))
    assert read_idx(tmp_path / "train-labels-idx1-ubyte").tolist() == [7, 3]
    x, y = load_mnist(tmp_path)
    assert x.shape == (2, 784) and y.tolist() == [7, 3] and np.isclose(x[0, 5], 5 / 255)
    for i in range(1, 6):
        with open(tmp_path / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"data": np.full((3, 3072), 255, np.uint8), b"labels": [i, i, i]}, f)
    x, y = load_cifar10(tmp_path)
    assert x.shape == (15, 3072) and x.max() == 1.0 and y.tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5]


def test_digits_rank_through_raysim_and_report(tmp_path):
    """Train the sigmoid MLP on digits with FedAvg through the runtime, measure at k = 10, draw the histogram."""
    from raysim.report import report

    out = tmp_path / "rank"
    s = rank_run("configs/fedlrgd/fedlrgd_rank_digits.yaml", out, k=10, num_coords=200,
                 overrides=["algorithm.rounds=4", "checkpoint.every=2", "backend=local"])
    table = pd.read_parquet(out / "rank.parquet")
    assert len(table) == s.coordinates > 100 and table["rank"].between(1, 10).all()
    assert (table["weight"].abs() >= 0.005).all()
    assert (out / "rank.json").exists()
    assert out / "rank_histogram.png" in report(out)


MNIST_DIR = Path(os.environ.get("RAYSIM_DATA_DIR", "data")) / "mnist"


@pytest.mark.slow
@pytest.mark.skipif(not MNIST_DIR.exists(), reason="MNIST IDX files not present (set RAYSIM_DATA_DIR)")
def test_mnist_prototype_ranks():
    """App. C, Fig. 1(b), K = 784, k = 60: at least ~90% of non-trivial weights have rank <= 10, median <= ~5."""
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    x, y = load_mnist(MNIST_DIR)
    tx, ty = load_mnist(MNIST_DIR, "test")
    module = build_model(ModelConfig(name="sigmoid_mlp", hidden=[784]), (784,), None, 10)
    theta = train_centralized(module, x, y, epochs=25)
    table = measure_ranks(cross_entropy_loss(module), theta, torch.as_tensor(tx), torch.as_tensor(ty), k=60, seed=0)
    s = summarize(table["rank"].to_numpy(), 60)
    assert s.share_le_10 >= 0.85 and s.median <= 6


CIFAR_DIR = Path(os.environ.get("RAYSIM_DATA_DIR", "data")) / "cifar-10-batches-py"


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR_DIR.exists(), reason="CIFAR-10 python batches not present (set RAYSIM_DATA_DIR)")
def test_cifar_prototype_ranks():
    """App. C, Fig. 2(b), k = 60: at least ~90% of non-trivial weights have rank <= 6."""
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    x, y = load_cifar10(CIFAR_DIR)
    tx, ty = load_cifar10(CIFAR_DIR, "test")
    module = build_model(ModelConfig(name="sigmoid_cnn", channels=[40, 40], hidden=[150]), (3072,), (3, 32, 32), 10)
    theta = train_centralized(module, x, y, epochs=15)
    table = measure_ranks(cross_entropy_loss(module), theta, torch.as_tensor(tx), torch.as_tensor(ty), k=60, seed=0)
    assert np.mean(table["rank"].to_numpy() <= 6) >= 0.85
