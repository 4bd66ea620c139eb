"""The FedLRGD paper's smooth problems as sources (FedLRGD, algorithms/fedlrgd/README.md): shapes, float64 targets in
[0, 1], s samples per client after the hold-out, the `smooth_logistic` label law, and clear errors."""
import numpy as np
import pytest

from raysim.data import DataConfig, build_federated, load_source, read_clients


def cfg(source, **kw):
    return DataConfig(**{"source": source, "num_clients": 50, "synthetic_samples": 1250, "synthetic_features": 2,
                         "partition": {"kind": "natural"}, **kw})


@pytest.mark.parametrize("source", ["smooth_logistic", "smooth_ridge"])
def test_fifty_clients_of_twenty_float64_samples(tmp_path, source):
    fed = build_federated(cfg(source), 0, tmp_path)
    assert fed.num_classes == 0 and fed.target_shape == () and fed.feature_shape == (2,)
    assert (fed.client_sizes == 20).all() and fed.num_test == 250
    x, y = read_clients(fed.train_path, [7])[7]
    assert x.dtype == np.float64 and y.dtype == np.float64 and x.shape == (20, 2)
    assert (0 <= x).all() and (x <= 1).all() and (0 <= y).all() and (y <= 1).all()
    a, b = load_source(cfg(source), 3), load_source(cfg(source), 3)
    assert np.array_equal(a.x, b.x) and not np.array_equal(a.x, load_source(cfg(source), 4).x)


def test_logistic_soft_labels_follow_the_spec_law():
    """y = σ(3(x1 − x2) + 0.5 N(0,1)): logit(y) − 3(x1 − x2) has mean 0 and sd 0.5 (n = 1250, 4 s.e.)."""
    src = load_source(cfg("smooth_logistic"), 0)
    resid = np.log(src.y / (1 - src.y)) - 3 * (src.x[:, 0] - src.x[:, 1])
    assert abs(resid.mean()) < 4 * 0.5 / np.sqrt(1250) and abs(resid.std() - 0.5) < 0.04


def test_ridge_targets_are_the_clipped_feature_mean_plus_noise():
    src = load_source(cfg("smooth_ridge", synthetic_features=3), 0)
    inside = (src.y > 0) & (src.y < 1)
    resid = src.y[inside] - src.x[inside].mean(1)
    assert abs(resid.mean()) < 0.02 and abs(resid.std() - 0.1) < 0.01


def test_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="synthetic_features"):
        load_source(cfg("smooth_logistic", synthetic_features=1), 0)
    with pytest.raises(ValueError, match="synthetic_samples"):
        load_source(cfg("smooth_ridge", synthetic_samples=40), 0)
    with pytest.raises(ValueError, match="float targets"):
        build_federated(cfg("smooth_ridge", partition={"kind": "dirichlet"}), 0, tmp_path)
