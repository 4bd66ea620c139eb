"""DP-FedAvg's pieces in LocalSGD: clipping against its closed form, and the server's noise against its law (Monte
Carlo)."""
import numpy as np
import pytest
import torch

from raysim.config import load_config
from raysim.core.rng import SERVER, stream
from raysim.training.local_sgd import ClippedDelta, ServerState, clip_rows

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
    assert torch.equal(clip_rows(before.clone(), 0.5), short)  # which rows were within the norm
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
    reply = ClippedDelta(total, 5.0, 3.0)
    state = ServerState(np.zeros(d, dtype=np.float32), clip=0.7)
    got, clip = algo.mean_update([reply], state, stream(0, 3, SERVER, "aggregate"))
    assert clip == 0.7  # fixed clipping keeps C
    noise = got.astype(np.float64) - total / 5
    sd = 1.5 * 0.7 / 5
    assert abs(noise.mean()) < 5 * sd / np.sqrt(d) and noise.std() == pytest.approx(sd, rel=5 * np.sqrt(0.5 / d))
    again, _ = algo.mean_update([reply], state, stream(0, 3, SERVER, "aggregate"))
    other, _ = algo.mean_update([reply], state, stream(0, 4, SERVER, "aggregate"))
    assert np.array_equal(got, again) and not np.array_equal(got, other)
    empty, _ = algo.mean_update([], state, stream(0, 3, SERVER, "aggregate"))
    assert empty.std() == pytest.approx(sd, rel=0.01)  # a round nobody finished is still noised


def test_adaptive_clipping_moves_the_norm_towards_the_quantile_and_splits_the_noise(tmp_path):
    """Andrew et al. (2021): C ← C·exp(−η_C (b̃ − γ)) with b̃ the noised fraction within C; z_Δ from Thm. 1."""
    from raysim.data import build_federated
    from raysim.round.experiment import make_algorithm
    from raysim.training.local_sgd import noise_split

    cfg = load_config({**CFG, "privacy": {"clip": 0.7, "noise_multiplier": 0.0,
                                          "adaptive_clip": {"quantile": 0.5, "lr": 0.2}}})
    algo = make_algorithm(cfg, build_federated(cfg.data, cfg.seed, tmp_path))
    state = ServerState(np.zeros(10, dtype=np.float32), clip=0.7)
    rng = stream(0, 1, SERVER, "aggregate")
    _, up = algo.mean_update([ClippedDelta(np.zeros(10, dtype=np.float32), 5.0, 1.0)], state, rng)
    draws = stream(0, 1, SERVER, "aggregate")
    draws.standard_normal(10)  # the updates' noise is drawn first (here z = 0: none added)
    fraction = (1.0 + 0.25 * draws.standard_normal()) / 5  # σ_b = k/20
    assert up == pytest.approx(0.7 * np.exp(-0.2 * (fraction - 0.5)), rel=1e-12) and up > 0.7 * np.exp(-0.2 * 0.5)
    z_update, sigma_b = noise_split(1.0, cfg.privacy.adaptive_clip, 40)
    assert sigma_b == 2.0 and (z_update ** -2 + (2 * sigma_b) ** -2) ** -0.5 == pytest.approx(1.0, rel=1e-12)
