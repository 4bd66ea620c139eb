"""Federated evaluation (`eval.clients`): each chosen client's loss and accuracy of the global model on its own
data, against a direct computation; its rows and the round's summary; bitwise the same for every packing and
both backends."""
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import raysim
from raysim.config import load_config
from raysim.contract import ClientBatch
from raysim.errors import ConfigError
from raysim.results.tables import reproducible

CFG = {
    "name": "client-eval", "seed": 4, "backend": "local",
    "data": {"source": "digits", "num_clients": 12, "partition": {"kind": "dirichlet", "alpha": 0.5}},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "fedavg", "rounds": 4, "clients_per_round": 5, "lr": 0.1, "local_steps": 3, "batch_size": 8},
    "eval": {"every": 2, "clients": "selected"},
    "checkpoint": {"every": 0},
}


@pytest.mark.parametrize("model", [{"name": "mlp", "hidden": [16]}, {"name": "cnn", "channels": [4, 8]}])
def test_each_clients_metrics_are_the_global_models_on_its_own_rows(model, tmp_path):
    """Against F.cross_entropy and argmax on each client's rows alone (float32 rounding: 1e-5), for the stacked
    path (mlp) and the one-forward-a-chunk path (cnn); clients of 1 to 100 rows, chunks cut mid-client."""
    from raysim.data import build_federated
    from raysim.round.experiment import make_algorithm

    cfg = load_config({**CFG, "model": model})
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    algo = make_algorithm(cfg, fed)
    theta = algo.init().params + np.random.default_rng(0).normal(0, 0.1, algo.spec.size).astype(np.float32)
    g = torch.Generator().manual_seed(1)
    sizes = np.array([1, 33, 100, 7, 64])
    x = torch.randn(int(sizes.sum()), *fed.feature_shape, generator=g)
    y = torch.randint(0, fed.num_classes, (int(sizes.sum()),), generator=g)
    batch = ClientBatch(np.arange(5), np.cumsum(sizes) - sizes, sizes, x, y)
    got = algo.evaluate_clients(theta, None, batch)
    module = algo.spec.module_with(algo.module, theta, torch.float32)
    for i in range(5):
        c = batch.client(i)
        with torch.no_grad():
            out = module(c.x)
        assert got["loss"][i] == pytest.approx(float(F.cross_entropy(out, c.y)), rel=1e-5)
        assert got["accuracy"][i] == pytest.approx(float((out.argmax(1) == c.y).double().mean()), abs=1e-12)


def test_a_run_writes_the_evaluated_clients_and_summarizes_them(tmp_path):
    result = raysim.run(CFG, out=tmp_path / "run", progress=False)
    ev = result.client_eval
    assert sorted(ev["round"].unique()) == [2, 4]
    for r in (2, 4):  # the round's selected clients, each once, in id order
        chosen = sorted(result.clients.loc[result.clients["round"] == r, "client_id"])
        assert ev.loc[ev["round"] == r, "client_id"].tolist() == chosen
    assert set(ev["split"]) == {"train"} and ev["accuracy"].between(0, 1).all() and (ev["samples"] > 0).all()
    row = result.rounds.set_index("round").loc[4]
    last = ev[ev["round"] == 4]
    assert row["client_accuracy_mean"] == pytest.approx(np.average(last["accuracy"], weights=last["samples"]), rel=1e-12)
    assert row["client_loss_p50"] == pytest.approx(np.percentile(last["loss"], 50), rel=1e-12)
    assert row["client_accuracy_p10"] <= row["client_accuracy_p50"] <= row["client_accuracy_p90"]
    assert pd.isna(result.rounds.set_index("round").loc[1].get("client_accuracy_mean"))


def test_federated_evaluation_is_bitwise_the_same_for_every_packing_and_backend(ray_cluster, tmp_path):
    cfg = {**CFG, "eval": {"every": 2, "clients": {"sample": 7}}}
    local = raysim.run(cfg, out=tmp_path / "local", progress=False)
    assert len(local.client_eval) == 14
    for name, cluster in {"two-actors": {"num_actors": 2, "driver_shard": False}}.items():
        other = raysim.run({**cfg, "backend": "ray", "cluster": cluster}, out=tmp_path / name, progress=False)
        pd.testing.assert_frame_equal(local.client_eval, other.client_eval)
        pd.testing.assert_frame_equal(reproducible(local.rounds), reproducible(other.rounds))


def test_clients_evaluation_is_refused_where_the_algorithm_cannot_do_it(tmp_path):
    with pytest.raises(ConfigError, match="eval.clients: algorithm 'fzoos' cannot evaluate on clients"):
        load_config({**CFG, "algorithm": {"name": "fzoos", "rounds": 2, "clients_per_round": 2}})
    with pytest.raises(ConfigError, match="eval.clients.sample: 20 exceeds data.num_clients=12"):
        load_config({**CFG, "eval": {"clients": {"sample": 20}}})

