"""`backend: local` and Ray give the same numbers, to the last bit, whatever the packing of the
clients into actors: fedavg (an MLP, and a CNN's vmapped gradients) and fzoos on 1, 2, 3 and 5 actors (fzoos on 2 and
3 under `-m slow`), 5 clients, so 5 actors is one client per actor."""
import numpy as np
import pytest

import raysim
from raysim.config import ConfigError, load_config
from raysim.results import HOST_COLUMNS
from raysim.round import shard


FEDAVG = {
    "name": "packing_fedavg", "seed": 3,
    "data": {"source": "digits", "num_clients": 5, "partition": {"kind": "dirichlet", "alpha": 0.5}},
    "model": {"name": "mlp", "hidden": [32]},
    "algorithm": {"name": "fedavg", "rounds": 6, "clients_per_round": 5, "lr": 0.1, "local_steps": 4, "batch_size": 8},
    "system": {"compute": {"unit": "batch"}, "stragglers": {"deadline": 10.0}},  # shards drop the late before reducing
}
FEDAVG_CNN = {**FEDAVG, "name": "packing_cnn", "model": {"name": "cnn", "channels": [16, 32]}}  # alone, other bits
FZOOS = {
    "name": "packing_fzoos", "seed": 1,
    "data": {"source": "blackbox", "num_clients": 5, "partition": {"kind": "natural"}},
    "algorithm": {"name": "fzoos", "rounds": 6, "clients_per_round": 5, "local_steps": 5, "lr": 0.01,
                  "num_features": 500, "objective": {"kind": "quadratic", "dim": 20, "heterogeneity": 5.0}},
}


def assert_same_numbers(a, b):
    for table in ("rounds", "clients"):
        x, y = getattr(a, table), getattr(b, table)
        assert list(x.columns) == list(y.columns)
        differ = [c for c in x.columns if c not in HOST_COLUMNS and not x[c].equals(y[c])]
        assert not differ, f"{table}: {differ} differ"


@pytest.mark.parametrize("cfg, layouts", [
    (FEDAVG, (2, 5)),
    (FEDAVG_CNN, (5,)),
    pytest.param(FEDAVG, (1, 3), marks=pytest.mark.slow),
    pytest.param(FZOOS, (1, 5), marks=pytest.mark.slow),  # fzoos over actor counts stays in its family's tests
    pytest.param(FZOOS, (2, 3), marks=pytest.mark.slow),
], ids=["fedavg", "fedavg-cnn", "fedavg-more", "fzoos", "fzoos-more"])
def test_local_and_every_packing_on_ray_give_the_same_bits(ray_cluster, tmp_path, cfg, layouts):
    local = raysim.run(cfg, out=tmp_path / "local", backend="local")
    assert local.info["backend"] == "local"
    if cfg is not FZOOS:
        assert local.clients["dropped"].any() and not local.clients["dropped"].all()
    for actors in layouts:
        on_ray = raysim.run(cfg, out=tmp_path / f"ray{actors}", cluster__num_actors=actors)  # 2 CPUs shared
        assert on_ray.info["shards"] == actors
        assert_same_numbers(local, on_ray)


def test_local_resumes_from_its_checkpoint_to_the_same_numbers(tmp_path):
    whole = raysim.run(FEDAVG, out=tmp_path / "whole", backend="local", checkpoint__every=2)
    part = raysim.run(FEDAVG, out=tmp_path / "part", backend="local", checkpoint__every=2,
                      on_round=lambda row: row["round"] < 3)  # stops after round 3, and checkpoints it
    assert len(part.rounds) == 3 and part.info["status"] == "stopped"
    resumed = raysim.run(None, resume=tmp_path / "part")
    assert resumed.info["resumed_from"] == 3
    assert_same_numbers(whole, resumed)


@pytest.mark.parametrize("override, named", [
    ({"system": {"clock": {"mode": "real"}}}, "system.clock.mode"),
    ({"faults": [{"round": 1, "actor": 0}]}, "faults"),
])
def test_local_refuses_what_needs_actors(override, named):
    with pytest.raises(ConfigError, match=named):
        load_config({**FEDAVG, "backend": "local", **override})


CHUNKED = {
    "name": "chunked", "seed": 5,
    "data": {"source": "synthetic", "num_clients": 1200, "partition": {"kind": "natural"},
             "synthetic_samples": 12000, "synthetic_features": 8},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "rounds": 3, "clients_per_round": 700, "lr": 0.1, "local_steps": 3, "batch_size": 4},
    "system": {"compute": {"unit": "batch"}, "stragglers": {"deadline": 6.5}},  # shards drop the late before reducing
}


def test_a_shard_on_several_threads_gives_the_same_bits_as_on_one_and_on_ray(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(shard, "CHUNK_SECONDS", 1e-9)  # every step cut, however light
    one = raysim.run(CHUNKED, out=tmp_path / "one", backend="local", cluster__num_cpus=1)
    two = raysim.run(CHUNKED, out=tmp_path / "two", backend="local", cluster__num_cpus=2)
    assert (one.info["shard_threads"], two.info["shard_threads"]) == (1, 2)
    assert one.clients["dropped"].any() and not one.clients["dropped"].all()
    assert_same_numbers(one, two)
    assert_same_numbers(one, raysim.run(CHUNKED, out=tmp_path / "ray", cluster__num_actors=2))


def test_the_compiled_kernels_give_the_numpy_and_torch_paths_bits(tmp_path, monkeypatch):
    """From COMPILED_MIN clients a call, a shard draws its batch plans and sums its reduction tree compiled: the
    tables are bit for bit those of NumPy's plans and torch's tree (clients dropped, a shard on two threads). The
    tree's sums are checked bit for bit in tests/round/test_reduction.py: a last bit seldom reaches a table."""
    from raysim.core import compiled
    from raysim.round import tree_kernel
    from raysim.training import plan_kernel

    monkeypatch.setattr(shard, "CHUNK_SECONDS", 1e-9)  # every step cut, however light
    monkeypatch.setattr(compiled, "COMPILED_MIN", 10**9)
    plain = raysim.run(CHUNKED, out=tmp_path / "plain", backend="local", cluster__num_cpus=2)
    calls = []
    for module, name in ((plan_kernel, "host_plans"), (tree_kernel, "block_sums")):
        def counted(*args, _f=getattr(module, name), _name=name):
            calls.append(_name)
            return _f(*args)
        monkeypatch.setattr(module, name, counted)
    monkeypatch.setattr(compiled, "COMPILED_MIN", 1)
    kernels = raysim.run(CHUNKED, out=tmp_path / "kernels", backend="local", cluster__num_cpus=2)
    assert kernels.info["shard_threads"] == 2 and {"host_plans", "block_sums"} <= set(calls)
    assert kernels.clients["dropped"].any() and not kernels.clients["dropped"].all()
    assert_same_numbers(plain, kernels)


def test_rows_read_from_disk_each_round_give_the_same_bits_and_a_shard_holds_none(ray_cluster, tmp_path):
    from raysim.config import load_config
    from raysim.data import build_federated
    from raysim.round.experiment import Experiment
    from raysim.round.shard import ClientShard, StoredClientRows

    held = raysim.run(CHUNKED, out=tmp_path / "held", backend="local")
    read = raysim.run(CHUNKED, out=tmp_path / "read", backend="local", data__client_rows="disk")
    assert (read.run_dir / "data" / "train_x.npy").exists()
    assert_same_numbers(held, read)
    assert_same_numbers(held, raysim.run(CHUNKED, out=tmp_path / "ray", cluster__num_actors=2, data__client_rows="disk"))
    cfg = load_config(CHUNKED, {"data.client_rows": "disk"})
    fed = build_federated(cfg.data, cfg.seed, tmp_path / "data")
    shard = ClientShard(Experiment.of(cfg), fed.to_dict(), range(fed.num_clients))
    assert isinstance(shard.data, StoredClientRows) and len(shard.states) == 0
    assert shard.data.first.nbytes + shard.data.sizes.nbytes == 8 * fed.num_clients  # no rows: 8 bytes a client
    shard.train(1, [5, 700, 3], shard.algo.plan(shard.algo.init(), 1, np.random.default_rng(0)).broadcast, reduce=True)
    assert len(shard.states) == 0  # fedavg's clients keep no state: nothing held per client
