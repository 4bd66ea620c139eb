"""Regression generators (algorithms/kernel/sources.py; the kernel FedAvg/FedProx paper, algorithms/kernel/README.md) and their
registered sources through the real data layer (natural partition, holdout, Parquet, float64)."""
import numpy as np
import pytest
from scipy.special import eval_chebyu

from raysim.algorithms.kernel.algorithm import split_targets, truth_coefficients, truth_theta
from raysim.config import ConfigError, load_config
from raysim.data import build_federated, read_clients, read_table_arrays
from raysim.data.config import DataConfig
from raysim.algorithms.kernel.sources import (CHEBYSHEV_U5, linear_model, polynomial_grid, polynomial_model, rows_before_holdout,
                                    sobolev_model, subspace_model)


def test_linear_model_exact_and_radius_heterogeneity():
    sizes = [50, 500, 50, 500]
    for gamma in (0.0, 0.3, 7.5):
        data = linear_model(sizes, 20, 0.5, gamma, "exact", np.random.default_rng(1))
        spread = max(np.linalg.norm(a - b) for a in data.theta for b in data.theta)
        assert spread == pytest.approx(gamma, abs=1e-12)
    data = linear_model(sizes, 20, 0.5, 2.0, "radius", np.random.default_rng(1))
    centre = np.random.default_rng(1).standard_normal(20)  # theta* is the first draw
    assert np.allclose(np.linalg.norm(data.theta - centre, axis=1), 2.0, atol=1e-12)
    for x, y, truth, theta in zip(data.x, data.y, data.truth, data.theta):
        assert np.allclose(truth, x @ theta, atol=1e-12)
    resid = np.concatenate([y - t for y, t in zip(data.y, data.truth)])
    assert resid.std() == pytest.approx(0.5, rel=0.05)  # 1100 draws: s.e. of the std about 2%
    assert list(data.sizes) == sizes


def test_subspace_model_observes_r_coordinates_with_fixed_row_norm():
    data = subspace_model([400, 400, 400], 50, 10, 0.5, np.random.default_rng(2))
    for x in data.x:
        assert (np.abs(x).sum(0) > 0).sum() == 10
        assert np.mean((x * x).sum(1)) == pytest.approx(50, rel=0.05)  # E||x||^2 = d at every r
    assert np.all(data.theta == data.theta[0])
    with pytest.raises(ValueError, match="rank"):
        subspace_model([5], 10, 11, 0.5, np.random.default_rng(0))


def test_subspace_model_coverage_is_coupon_collecting():
    """Fig. 5's jump (Sec. 6.3): 20 independent uniform r-subsets of 100 coordinates leave
    d (1 - r/d)^M coordinates unobserved on average: 0.54 at r = 23 (2000 draws: s.e. about 0.017)."""
    rng = np.random.default_rng(5)
    missed = []
    for _ in range(2000):
        data = subspace_model([1] * 20, 100, 23, 0.5, rng)
        missed.append(100 - np.count_nonzero(np.abs(np.concatenate(data.x)).sum(0)))
    assert np.mean(missed) == pytest.approx(100 * 0.77 ** 20, abs=4 * np.std(missed) / np.sqrt(2000))


def test_polynomial_model_is_chebyshev_u5_on_disjoint_grids():
    data = polynomial_model([4, 4, 4, 4], 0.5, "midpoint", np.random.default_rng(3))
    x = np.concatenate([xi[:, 0] for xi in data.x])
    assert np.allclose(x, -1 + 2 / 16 * (np.arange(16) + 0.5))  # 4 clients x 4 midpoints tile [-1, 1)
    assert np.allclose(np.concatenate(data.truth), eval_chebyu(5, x), atol=1e-12)
    assert np.allclose(np.polynomial.polynomial.polyval(x, CHEBYSHEV_U5), eval_chebyu(5, x), atol=1e-12)
    assert np.allclose(polynomial_grid(0, 2, 2, "left"), [-1.0, -0.5])


def test_sobolev_model_intervals():
    data = sobolev_model([20, 200, 20], 0.5, np.random.default_rng(7))
    for i, x in enumerate(data.x):
        assert np.all((i / 3 <= x) & (x <= (i + 1) / 3))
        assert np.allclose(data.truth[i], np.sin(np.pi * x[:, 0]))
    assert data.theta is None


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.3, 0.25])
def test_rows_before_holdout_leave_exactly_n(fraction):
    for n in (1, 7, 50, 500):
        m = rows_before_holdout(n, fraction)
        assert m - np.floor(fraction * m) == n and (m - 1) - np.floor(fraction * (m - 1)) < n


def test_source_through_data_layer_keeps_unbalanced_sizes_float64_and_truth(tmp_path):
    cfg = DataConfig(source="linear_regression", num_clients=4, test_fraction=0.2, partition={"kind": "natural"},
                     options={"sizes": [30, 7], "dim": 6, "noise": 0.5})
    fed = build_federated(cfg, 0, tmp_path)
    assert fed.client_sizes.tolist() == [30, 7, 30, 7] and fed.num_classes == 0
    assert fed.target_shape == (2 + 6,)  # [response, f*(x), theta*]
    tx, ty = read_table_arrays(fed.test_path)
    assert tx.dtype == np.float64 and ty.dtype == np.float64
    star = truth_coefficients(tx, split_targets(ty)[1])  # homogeneous: the test truth is one theta*
    assert star is not None and np.allclose(ty[:, 2:], star, rtol=1e-10, atol=1e-10)
    for c, (x, y) in read_clients(fed.train_path, range(4)).items():
        response, truth = split_targets(y)
        assert np.allclose(truth, x @ star, rtol=1e-10, atol=1e-10)
        assert not np.allclose(response, truth)  # noisy responses, noise-free truth
        assert np.allclose(truth_theta(x, y), star, rtol=1e-10, atol=1e-10)  # n_c = 7 rows pin theta* down too


def test_sources_carry_each_clients_truth_coefficients(tmp_path):
    """Issue 19: under model heterogeneity every row carries its client's theta_i*, which gives its truth, so a
    data-scarce client's theta_j* is known although its n_j < d noise-free values cannot determine it."""
    cfg = DataConfig(source="linear_regression", num_clients=4, test_fraction=0.2, partition={"kind": "natural"},
                     options={"sizes": [3, 20], "dim": 6, "noise": 0.5, "heterogeneity": 1.5})
    fed = build_federated(cfg, 1, tmp_path / "linear")
    clients = read_clients(fed.train_path, range(4))
    thetas = np.array([truth_theta(x, y) for x, y in clients.values()])
    assert truth_coefficients(clients[0][0], split_targets(clients[0][1])[1]) is None  # 3 < 6 values
    assert max(np.linalg.norm(a - b) for a in thetas for b in thetas) == pytest.approx(1.5, abs=1e-12)  # exact Gamma
    for (x, y), theta in zip(clients.values(), thetas):
        assert np.allclose(x @ theta, split_targets(y)[1], rtol=1e-12, atol=1e-12)
    tx, ty = read_table_arrays(fed.test_path)
    assert truth_theta(tx, ty) is None  # the test rows mix four truths
    sob = DataConfig(source="sobolev_regression", num_clients=2, test_fraction=0.2, partition={"kind": "natural"},
                     options={"sizes": [5]})
    assert build_federated(sob, 1, tmp_path / "sobolev").target_shape == (2,)  # no finite-rank truth to carry


def test_regression_config_errors_name_the_field():
    base = {"data": {"source": "linear_regression", "num_clients": 2, "partition": {"kind": "natural"}}}
    with pytest.raises(ConfigError, match="data.options.bogus: unknown field"):
        load_config({**base, "data": {**base["data"], "options": {"bogus": 1}}})
    with pytest.raises(ConfigError, match="data.options.heterogeneity_kind"):
        load_config({**base, "data": {**base["data"], "options": {"heterogeneity_kind": "wide"}}})
    with pytest.raises(ConfigError, match="data.options.sizes"):
        load_config({**base, "data": {**base["data"], "options": {"sizes": [0, 3]}}})
