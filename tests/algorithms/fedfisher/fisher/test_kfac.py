"""K-FAC factors: exactness for one sample, the mv convention, PSD, scaling, payload sizes (Sec. 4, App. C)."""
import numpy as np
import pytest
import torch
from torch import nn

from raysim.algorithms.fedfisher.fisher import diagonal_fisher, kfac_fisher
from raysim.models import ModelConfig, build_model

from .conftest import exact_fisher


def test_one_sample_linear_blocks_equal_the_exact_fisher_blocks():
    """One sample: for a Linear layer sum_c (g_c g_c^T) ⊗ (a a^T) is the exact block, so G ⊗ A must equal it."""
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4, bias=False)).double()
    x = torch.randn(1, 6, dtype=torch.float64)
    kfac = kfac_fisher(module, x)
    full = exact_fisher(module, x)
    # parameter order: 0.weight (5x6), 0.bias (5), 2.weight (4x5); the K-FAC matrix of layer 0 is [W | b]
    w0, b0 = np.arange(30).reshape(5, 6), 30 + np.arange(5)
    layer0 = np.concatenate([w0, b0[:, None]], axis=1).reshape(-1)
    layer2 = 35 + np.arange(20)
    for block, idx in zip(kfac.blocks, [layer0, layer2]):
        np.testing.assert_allclose(np.kron(block.G, block.A), full[np.ix_(idx, idx)], rtol=1e-10, atol=1e-14)


def test_mv_convention_vec_gva_equals_kron_times_vec():
    """Row-major vec(G V A) = (G ⊗ A) vec(V) for the symmetric factors K-FAC produces."""
    g = torch.randn(4, 4, dtype=torch.float64)
    a = torch.randn(3, 3, dtype=torch.float64)
    g, a = g + g.T, a + a.T
    v = torch.randn(4, 3, dtype=torch.float64)
    np.testing.assert_allclose((g @ v @ a).reshape(-1), torch.kron(g, a) @ v.reshape(-1), rtol=1e-12)


def test_factors_symmetric_psd_averaged_and_correlated_with_the_diagonal():
    torch.manual_seed(1)
    module = build_model(ModelConfig(name="lenet"), (784,), (1, 28, 28), 10)
    x = torch.randn(24, 784, generator=torch.Generator().manual_seed(3))
    kfac = kfac_fisher(module, x, batch_size=10)
    twice = kfac_fisher(module, torch.cat([x, x]), batch_size=10)
    for b, b2 in zip(kfac.blocks, twice.blocks):
        for m, m2 in ((b.A, b2.A), (b.G, b2.G)):
            np.testing.assert_allclose(m, m.T, rtol=1e-5, atol=1e-7)
            assert np.linalg.eigvalsh(m.astype(np.float64)).min() > -1e-5 * np.abs(m).max()
            np.testing.assert_allclose(m2, m, rtol=1e-4, atol=1e-7)
    kron_diag = np.concatenate([np.outer(np.diag(b.G), np.diag(b.A)).reshape(-1) for b in kfac.blocks])
    assert np.corrcoef(kron_diag, diagonal_fisher(module, x))[0, 1] > 0.9


@pytest.mark.parametrize("name,image,d,factors", [
    ("lenet", (1, 28, 28), 44_190, 131_965),
    ("paper_cnn", (3, 32, 32), 939_616, 3_767_901),
])
def test_payload_sizes_of_spec_2_4(name, image, d, factors):
    torch.manual_seed(0)
    module = build_model(ModelConfig(name=name), (int(np.prod(image)),), image, 10)
    assert sum(p.numel() for p in module.parameters()) == d
    kfac = kfac_fisher(module, torch.randn(2, int(np.prod(image))), batch_size=2)
    assert kfac.floats == factors
    assert diagonal_fisher(module, torch.randn(2, int(np.prod(image)))).size == d
