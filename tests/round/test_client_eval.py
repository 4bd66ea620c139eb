"""Federated evaluation (`eval.clients`): each chosen client's loss and accuracy of the global model on its own
data, against a direct computation; its rows and the round's summary; bitwise the same for every packing and
both backends."""
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import raysim
from raysim import register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.config import load_config
from raysim.contract import ClientBatch, Steps
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


@pytest.mark.parametrize("fraction", [0.3, 0.0097])
def test_clients_are_evaluated_on_their_held_out_local_rows(fraction, tmp_path):
    """data.local_test_fraction: each client's metrics at the last round are the final model's on its local test
    rows alone (floor(fraction n_c) of them; at 0.0097, one row of the clients of 104 to 181 and none, so NaN, of
    those of 68 and 101), and training sees only the rest."""
    from raysim.data import build_federated, read_clients
    from raysim.results.export import load_federated

    cfg = {**CFG, "data": {**CFG["data"], "local_test_fraction": fraction}, "eval": {"every": 2, "clients": "all"},
           "checkpoint": {"every": 4}}
    result = raysim.run(cfg, out=tmp_path / "run", progress=False)
    whole = build_federated(load_config(CFG).data, CFG["seed"], tmp_path / "whole")
    fed = load_federated(tmp_path / "run", load_config(cfg))
    ev = result.client_eval[result.client_eval["round"] == 4].set_index("client_id")
    assert set(ev["split"]) == {"local_test"}
    assert ev["samples"].tolist() == np.floor(fraction * whole.client_sizes).astype(int).tolist()
    assert np.array_equal(fed.client_sizes, whole.client_sizes - ev["samples"].to_numpy())
    module = result.model()
    held = [c for c in range(12) if ev.loc[c, "samples"]]
    for c, (x, y) in read_clients(fed.local_test_path, held).items():
        x, y = torch.tensor(x), torch.tensor(y)
        with torch.no_grad():
            out = module(x)
        assert ev.loc[c, "loss"] == pytest.approx(float(F.cross_entropy(out, y)), rel=1e-5)
        assert ev.loc[c, "accuracy"] == pytest.approx(float((out.argmax(1) == y).double().mean()))
    assert ev.loc[ev["samples"] == 0, "accuracy"].isna().all() and ev["accuracy"].notna().sum() == len(held)
    assert len(held) == (12 if fraction == 0.3 else 10)


def test_federated_evaluation_is_bitwise_the_same_for_every_packing_and_backend(ray_cluster, tmp_path):
    """With and without local test rows; shards holding their rows in memory or reading them from disk."""
    for local in (0.0, 0.3):
        cfg = {**CFG, "data": {**CFG["data"], "local_test_fraction": local}, "eval": {"every": 2, "clients": {"sample": 7}}}
        memory = raysim.run(cfg, out=tmp_path / f"memory-{local}", progress=False)
        assert len(memory.client_eval) == 14
        runs = {"disk": {**cfg, "data": {**cfg["data"], "client_rows": "disk"}},
                "two-actors": {**cfg, "backend": "ray", "cluster": {"num_actors": 2, "driver_shard": False}}}
        for name, other_cfg in runs.items():
            other = raysim.run(other_cfg, out=tmp_path / f"{name}-{local}", progress=False)
            pd.testing.assert_frame_equal(memory.client_eval, other.client_eval)
            pd.testing.assert_frame_equal(reproducible(memory.rounds), reproducible(other.rounds))


def test_clients_evaluation_is_refused_where_the_algorithm_cannot_do_it(tmp_path):
    with pytest.raises(ConfigError, match="eval.clients: algorithm 'fzoos' cannot evaluate on clients"):
        load_config({**CFG, "algorithm": {"name": "fzoos", "rounds": 2, "clients_per_round": 2}})
    with pytest.raises(ConfigError, match="eval.clients.sample: 20 exceeds data.num_clients=12"):
        load_config({**CFG, "eval": {"clients": {"sample": 20}}})



@pytest.mark.parametrize("stored", [False, True])
def test_a_shard_of_clients_without_local_test_rows_has_empty_blocks(stored, tmp_path):
    """client_rows of clients with no local test row (clients 1 and 11 at 0.0097: 68 and 101 samples): zero-size
    blocks in memory and on disk alike, beside a client that has its one row."""
    from raysim.data import build_federated, read_clients
    from raysim.round.shard import client_rows

    rows = "disk" if stored else "memory"
    cfg = load_config({**CFG, "data": {**CFG["data"], "local_test_fraction": 0.0097, "client_rows": rows}})
    local = build_federated(cfg.data, cfg.seed, tmp_path).local_test()
    assert local is not None
    for clients in ([1, 11], [0, 1, 11]):
        batch = client_rows(local, clients, torch.float32, "cpu", stored).batch(np.array(clients))
        assert batch.sizes.tolist() == [1, 0, 0][-len(clients):] and len(batch.x) == sum(batch.sizes)
    x, _ = read_clients(local.train_path, [0])[0]
    assert np.array_equal(batch.client(0).x.numpy(), x)


@register_algorithm("fedavg_personal")
class FedAvgPersonal(FedAvg):
    """A personalization plugin's shape: a client state (here the rounds the client trained) that its federated
    evaluation reads through `cstates`."""

    def client_init(self, client):
        return 0

    def step_batch(self, cstates, batch, broadcast, keys):
        out = super().step_batch(None, batch, broadcast, keys)
        return Steps(out.replies, [s + 1 for s in cstates], out.costs)

    def evaluate_clients(self, payload, cstates, batch):
        return {**super().evaluate_clients(payload, None, batch), "trained": np.array(cstates, dtype=np.float64)}


def test_a_plugin_evaluates_each_client_with_its_own_state(ray_cluster, tmp_path):
    """`evaluate_clients` gets each evaluated client's state as its steps left it (the rounds it trained up to the
    evaluated round, from clients.parquet), on the local backend and on Ray's actors alike."""
    cfg = {**CFG, "algorithm": {**CFG["algorithm"], "name": "fedavg_personal"}, "eval": {"every": 2, "clients": "all"}}
    local = raysim.run(cfg, out=tmp_path / "local", progress=False)
    for r in (2, 4):
        trained = local.clients[local.clients["round"] <= r]["client_id"].value_counts()
        got = local.client_eval[local.client_eval["round"] == r].set_index("client_id")["trained"]
        assert got.tolist() == [float(trained.get(c, 0)) for c in range(12)]
    assert local.client_eval["trained"].max() >= 2
    ray = raysim.run({**cfg, "backend": "ray", "cluster": {"num_actors": 2, "driver_shard": False}},
                     out=tmp_path / "ray", progress=False)
    pd.testing.assert_frame_equal(local.client_eval, ray.client_eval)
