"""App. C compression (FedFisher, algorithms/fedfisher/README.md): the quantizer's grid, Eckart-Young for the
truncated SVD, and the uplink bits of LeNet against its per-layer factor shapes (about 1.03 x 32d for K-FAC)."""
import numpy as np
import pytest
import torch

from raysim.algorithms.fedfisher.fisher import kfac_fisher
from raysim.algorithms.fedfisher.fisher.compress import Compression, low_rank, paper_rank, quantize
from raysim.models import ModelConfig, ParamSpec, build_model

# LeNet's (dim A, dim G) per layer (App. C's m_{l-1}, m_l), and its parameter tensors
LENET_FACTORS = [(25, 6), (150, 16), (256, 120), (120, 84), (84, 10)]
LENET_D, LENET_TENSORS = 44_190, 5


def test_quantize_rounds_to_the_nearest_of_2_to_the_b_minus_1_minus_1_levels():
    """3 bits: levels 3 of the scale max|x| = 2: x/2·3 = [3, 1.5, -0.9, 0.3] rounds (half to even) to [3, 2, -1, 0]."""
    q, bits = quantize(np.array([2.0, 1.0, -0.6, 0.2]), 3)
    np.testing.assert_allclose(q, [2.0, 4 / 3, -2 / 3, 0.0])
    assert bits == 3 * 4 + 32
    x = np.random.default_rng(0).standard_normal(1000)
    q, _ = quantize(x, 16)
    assert np.abs(q - x).max() <= np.abs(x).max() / (2 * (2**15 - 1)) * (1 + 1e-12)
    assert np.unique(np.round(q / np.abs(x).max() * (2**15 - 1), 6) % 1).tolist() == [0.0]


def test_low_rank_error_is_the_first_dropped_singular_value():
    """Eckart-Young: ‖M − M_r‖_2 = σ_{r+1}; the 16-bit quantization of U, S, V adds ~1e-4 relative."""
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.standard_normal((30, 30)))
    sigma = np.geomspace(10.0, 0.01, 30)
    m = (q * sigma) @ q.T
    approx, bits = low_rank(m, 7, 16)
    assert np.linalg.norm(m - approx, 2) == pytest.approx(sigma[7], rel=0.02, abs=1e-3)
    assert bits == 16 * (2 * 30 * 7 + 7) + 3 * 32
    full, _ = low_rank(m, 100, 16)  # rank capped at the dimension
    np.testing.assert_allclose(full, m, atol=1e-3)


@pytest.fixture(scope="module")
def lenet_upload():
    torch.manual_seed(0)
    module = build_model(ModelConfig(name="lenet"), (784,), (1, 28, 28), 10)
    spec = ParamSpec.of(module)
    params = torch.nn.utils.parameters_to_vector(module.parameters()).detach().numpy()
    kfac = kfac_fisher(module, torch.randn(4, 784, generator=torch.Generator().manual_seed(1)), batch_size=4)
    return params, kfac, spec


def test_lenet_kfac_uplink_is_about_32d_bits_as_the_code_counts_it(lenet_upload):
    """The code's self-check (d_new + 16d)/(32d) ≈ 1.03 (App. C): rank int(2d/Σ(2a + 2g + 2)) = 50,
    9-bit U, S, V and three 32-bit scales per factor, 16-bit weights with one scale per tensor."""
    params, kfac, spec = lenet_upload
    rank = int(2 * LENET_D / sum(2 * a + 2 * g + 2 for a, g in LENET_FACTORS))
    assert rank == 50 == paper_rank(kfac, spec.size)
    d_new = sum(9 * (2 * m * min(m, rank) + min(m, rank)) + 3 * 32 for pair in LENET_FACTORS for m in pair)
    expect = 16 * LENET_D + 32 * LENET_TENSORS + d_new
    weights, sent, bits = Compression("paper").apply(params, kfac, spec)
    assert bits == expect
    assert 1.02 < bits / (32 * LENET_D) < 1.04  # vs 4.0 x 32d uncompressed (App. C)
    for b, s in zip(kfac.blocks, sent.blocks):  # the factors the server uses are the rank-50 reconstructions
        assert np.linalg.matrix_rank(s.A) <= min(len(b.A), 50) and np.linalg.matrix_rank(s.G) <= min(len(b.G), 50)
    assert np.abs(weights - params).max() < np.abs(params).max() / 2**15


def test_lenet_diag_uplink_is_32_bits_per_parameter_plus_the_scales(lenet_upload):
    """Diag: weights and diagonal at 16 bits, one 32-bit scale per tensor each: 32(d + 2L) (App. C)."""
    params, _, spec = lenet_upload
    diag = np.random.default_rng(2).exponential(1.0, spec.size)
    _, sent, bits = Compression("paper").apply(params, diag, spec)
    assert bits == 32 * (LENET_D + 2 * LENET_TENSORS)
    assert np.abs(sent - diag).max() <= diag.max() / (2 * (2**15 - 1)) * (1 + 1e-9)


def test_explicit_compression_uses_app_c_formulas(lenet_upload):
    """s_q = 4: 8-bit factors; s_v = 1.5: rank ⌊m/3⌋ per factor; s_v = 1: quantized, no SVD."""
    params, kfac, spec = lenet_upload
    _, _, bits = Compression("explicit", s_q=4, s_v=1.5).apply(params, kfac, spec)
    factors = sum(8 * (2 * m * (m // 3) + m // 3) + 96 for pair in LENET_FACTORS for m in pair)
    assert bits == 16 * LENET_D + 32 * LENET_TENSORS + factors
    _, _, bits = Compression("explicit", s_q=4, s_v=1.0).apply(params, kfac, spec)
    assert bits == 16 * LENET_D + 32 * LENET_TENSORS + sum(8 * m * m + 32 for pair in LENET_FACTORS for m in pair)
