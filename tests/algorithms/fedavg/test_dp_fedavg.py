"""DP-FedAvg end to end (`privacy:`): ε per round as the accountant gives it, a calibrated target met, the same
bits on every backend, and the configurations it cannot hold refused in one line."""
import pandas as pd
import pytest

import raysim
from raysim.config import load_config
from raysim.core.privacy import calibrated_noise, epsilon_after
from raysim.errors import ConfigError
from raysim.results.tables import reproducible

CFG = {"name": "dp-fedavg", "seed": 2, "backend": "local", "data": {"source": "digits", "num_clients": 30},
       "model": {"name": "logreg"},
       "algorithm": {"name": "fedavg", "rounds": 6, "clients_per_round": 10, "lr": 0.1, "local_steps": 5, "batch_size": 10},
       "privacy": {"clip": 1.0, "noise_multiplier": 0.8}, "checkpoint": {"every": 0}}


def test_each_round_reports_the_epsilon_spent_so_far(tmp_path):
    rounds = raysim.run(CFG, out=tmp_path / "run", progress=False).rounds
    assert rounds["epsilon"].tolist() == [epsilon_after(30, 10, 0.8, t, 1e-5) for t in range(1, 7)]
    assert (rounds["noise_multiplier"] == 0.8).all() and (rounds["clip"] == 1.0).all()


def test_a_target_epsilon_is_met_at_the_last_round(tmp_path):
    cfg = {**CFG, "privacy": {"clip": 1.0, "target_epsilon": 4.0, "delta": 1e-4}}
    rounds = raysim.run(cfg, out=tmp_path / "run", progress=False).rounds
    z = calibrated_noise(30, 10, 6, 4.0, 1e-4)
    assert (rounds["noise_multiplier"] == z).all() and rounds["epsilon"].iloc[-1] <= 4.0 < epsilon_after(30, 10, 0.99 * z, 6, 1e-4)


@pytest.mark.parametrize("name", ["fedprox", "fedavgm", "fedadagrad", "fedadam", "fedyogi", "fedavg_counting"])
def test_every_localsgd_algorithm_runs_private(name, tmp_path):
    """fedprox, the FedOpt server optimizers and a LocalSGD plugin (tests/conftest.py's fedavg_counting) take
    `privacy:`: their rounds report the accountant's ε and differ from the same run without privacy."""
    cfg = {**CFG, "algorithm": {**CFG["algorithm"], "name": name, "rounds": 3}}
    private = raysim.run(cfg, out=tmp_path / "private", progress=False).rounds
    plain = raysim.run({**cfg, "privacy": None}, out=tmp_path / "plain", progress=False).rounds
    assert private["epsilon"].tolist() == [epsilon_after(30, 10, 0.8, t, 1e-5) for t in range(1, 4)]
    assert "epsilon" not in plain and (private["train_loss"] != plain["train_loss"]).all()


ADAPTIVE = {**CFG, "privacy": {"clip": 5.0, "noise_multiplier": 0.8, "adaptive_clip": {"quantile": 0.5, "lr": 0.5}}}


def test_adaptive_clipping_brings_a_loose_norm_down_and_spends_what_z_spends(tmp_path):
    """A clip norm far above every update's (5.0) falls round after round (b̃ near 1 > γ = 0.5); ε is that of z."""
    rounds = raysim.run(ADAPTIVE, out=tmp_path / "run", progress=False).rounds
    assert rounds["clip"].is_monotonic_decreasing and rounds["clip"].iloc[-1] < 0.5 * 5.0
    assert rounds["epsilon"].tolist() == [epsilon_after(30, 10, 0.8, t, 1e-5) for t in range(1, 7)]


def test_private_runs_are_bitwise_the_same_on_both_backends(ray_cluster, tmp_path):
    local = raysim.run(ADAPTIVE, out=tmp_path / "local", progress=False)
    ray = raysim.run({**ADAPTIVE, "backend": "ray", "cluster": {"num_actors": 2, "driver_shard": False}},
                     out=tmp_path / "ray", progress=False)
    pd.testing.assert_frame_equal(reproducible(local.rounds), reproducible(ray.rounds))
    pd.testing.assert_frame_equal(reproducible(local.clients), reproducible(ray.clients))


@pytest.mark.parametrize("change, message", [
    ({"algorithm": {**CFG["algorithm"], "name": "scaffold"}}, "privacy: algorithm 'scaffold' has no DP-FedAvg form"),
    ({"algorithm": {**CFG["algorithm"], "quantizer": "qsgd"}}, "algorithm.quantizer: 'qsgd' can lengthen a clipped update"),
    ({"privacy": {"clip": 1.0}}, "give exactly one of noise_multiplier and target_epsilon"),
    ({"privacy": {"clip": 1.0, "noise_multiplier": 1.0, "target_epsilon": 2.0}}, "give exactly one of"),
    ({"privacy": {"clip": 1.0, "target_epsilon": 1e-9, "delta": 1e-9}}, "privacy.target_epsilon: no noise multiplier"),
    ({"privacy": {"clip": 1.0, "noise_multiplier": 2.0, "adaptive_clip": {"count_noise": 0.5}}},
     "privacy.adaptive_clip.count_noise: 0.5 must exceed the noise multiplier's half, 1"),
    ({"system": {"availability": {"kind": "bernoulli", "p": 0.5}}},
     "privacy: the accountant assumes each round's clients drawn uniformly from all 30, but system.availability"
     " 'bernoulli' selects only online ones"),
])
def test_what_dp_fedavg_cannot_hold_is_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        load_config({**CFG, **change})
