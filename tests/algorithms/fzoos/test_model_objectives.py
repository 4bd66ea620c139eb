"""Data-based objectives (FZooS, algorithms/fzoos/README.md) on bundled digits and the Gaussian-mixture source."""
import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score, jaccard_score, precision_score, recall_score

from raysim.contract import Context
from raysim.data import DataConfig, build_federated
from raysim.models import ModelConfig
from raysim.algorithms.fzoos.model_objectives import AttackObjective, MetricObjective, macro_scores


def context(tmp_path, data, model, seed=0):
    fed = build_federated(DataConfig(**data), seed, tmp_path)
    return Context(seed=seed, rounds=1, clients_per_round=fed.num_clients, num_clients=fed.num_clients,
                   client_sizes=fed.client_sizes, feature_shape=fed.feature_shape, image_shape=fed.image_shape,
                   num_classes=fed.num_classes, model=ModelConfig(**model), params=None, train_path=fed.train_path)


@pytest.mark.parametrize("metric,ref", [("precision", precision_score), ("recall", recall_score),
                                        ("f1", f1_score), ("jaccard", jaccard_score)])
def test_macro_scores_match_scikit_learn(metric, ref):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 60)
    preds = np.stack([rng.integers(0, 6, 60), y, np.where(rng.random(60) < 0.7, y, 1)])
    got = macro_scores(torch.tensor(preds), torch.tensor(y), 6, metric)
    want = [ref(y, p, average="macro", zero_division=0) for p in preds]
    assert np.allclose(got.numpy(), want, atol=1e-12)


def test_metric_objective_on_the_gaussian_mixture(tmp_path):
    ctx = context(tmp_path, {"source": "gaussian_mixture", "synthetic_features": 54, "synthetic_classes": 7,
                             "synthetic_samples": 1400, "num_clients": 7, "test_fraction": 0.5,
                             "partition": {"kind": "shards", "shards_per_client": 2}}, {"hidden": [30, 14]})
    obj = MetricObjective(ctx, "precision", 0.2, pretrain_steps=50, pretrain_lr=0.02)
    assert obj.dim == 54 * 30 + 30 + 30 * 14 + 14 + 14 * 7 + 7 == 2189
    f0 = obj.value(obj.x0)
    assert 0.0 < f0 < 0.95  # macro precision on a class-skewed client also counts the classes it never holds
    want = np.mean([1 - precision_score(y.numpy(), obj.net.logits(obj.theta, x).argmax(-1).numpy(),
                                        average="macro", zero_division=0) for x, y in obj.clients])
    assert f0 == pytest.approx(want, abs=1e-12)


def test_attack_objective_margins_on_digits(tmp_path):
    ctx = context(tmp_path, {"source": "digits", "num_clients": 4,
                             "partition": {"kind": "shards", "shards_per_client": 5}}, {"hidden": [16]})
    obj = AttackObjective(ctx, 0.3, image=0, train_steps=150, train_lr=0.02, start="zero")
    margins = torch.stack([obj.local(i, obj.x0[None])[0] for i in range(4)])
    assert obj.dim == 64 and margins.mean() > 0  # a valid image: positive mean margin at zero perturbation
    assert obj.value(obj.x0) == pytest.approx(float(margins.mean()), abs=1e-12)
    obj2 = AttackObjective(ctx, 0.3, image=0, train_steps=150, train_lr=0.02, start="zero")
    assert torch.equal(obj.image, obj2.image) and all(torch.equal(a, b) for a, b in zip(obj.models, obj2.models))


def test_blackbox_source_has_one_row_per_client_and_needs_natural(tmp_path):
    fed = build_federated(DataConfig(source="blackbox", num_clients=4, partition={"kind": "natural"}), 0, tmp_path)
    assert list(fed.client_sizes) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="natural"):
        build_federated(DataConfig(source="blackbox", num_clients=4), 0, tmp_path / "x")


def test_covtype_is_never_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="never downloaded"):
        build_federated(DataConfig(source="covtype", num_clients=2), 0, tmp_path / "d")
