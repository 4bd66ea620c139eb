"""DP-FedAvg's pieces in LocalSGD: clipping against its closed form, and the server's noise against its law (Monte
Carlo)."""
import numpy as np
import pytest
import torch

from raysim.config import load_config
from raysim.core.rng import SERVER, stream
from raysim.training.local_sgd import WeightedDelta, clip_rows

CFG = {"name": "dp", "data": {"source": "digits", "num_clients": 20}, "model": {"name": "logreg"},
       "algorithm": {"name": "fedavg", "rounds": 3, "clients_per_round": 5},
       "privacy": {"clip": 0.7, "noise_multiplier": 1.5}}


def test_updates_are_clipped_to_the_norm_and_shorter_ones_kept_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    deltas = torch.randn(50, 300, generator=g) * torch.logspace(-3, 1, 50)[:, None]
    before = deltas.clone()
    clip_rows(deltas, 0.5)
    norms, old = torch.linalg.vector_norm(deltas, dim=1), torch.linalg.vector_norm(before, dim=1)
    short = old <= 0.5
    assert torch.equal(deltas[short], before[short]) and short.any() and (~short).any()
    torch.testing.assert_close(norms[~short], torch.full_like(norms[~short], 0.5), rtol=1e-6, atol=0)
    cos = (deltas * before).sum(1) / (norms * old)  # the direction kept
    torch.testing.assert_close(cos, torch.ones_like(cos), rtol=1e-6, atol=1e-6)


def test_the_server_adds_gaussian_noise_of_std_z_clip_over_the_kept_clients(tmp_path):
    """(Σ clip(Δ) + N(0, (zC)² I)) / k: with a known sum, the remainder's mean 0 and std zC/k over 2x10^5
    coordinates (5 standard errors); the same round's noise again from the same stream, a new round's another."""
    from raysim.data import build_federated
    from raysim.round.experiment import make_algorithm

    cfg = load_config(CFG)
    algo = make_algorithm(cfg, build_federated(cfg.data, cfg.seed, tmp_path))
    d = 200_000
    total = np.linspace(-1, 1, d).astype(np.float32)
    reply = WeightedDelta(total, 5.0)
    got = algo.mean_update([reply], np.zeros(d, dtype=np.float32), stream(0, 3, SERVER, "aggregate"))
    noise = got.astype(np.float64) - total / 5
    sd = 1.5 * 0.7 / 5
    assert abs(noise.mean()) < 5 * sd / np.sqrt(d) and noise.std() == pytest.approx(sd, rel=5 * np.sqrt(0.5 / d))
    again = algo.mean_update([reply], np.zeros(d, dtype=np.float32), stream(0, 3, SERVER, "aggregate"))
    other = algo.mean_update([reply], np.zeros(d, dtype=np.float32), stream(0, 4, SERVER, "aggregate"))
    assert np.array_equal(got, again) and not np.array_equal(got, other)
    empty = algo.mean_update([], np.zeros(d, dtype=np.float32), stream(0, 3, SERVER, "aggregate"))
    assert empty.std() == pytest.approx(sd, rel=0.01)  # a round nobody finished is still noised
