import math

import numpy as np
import pytest

from scipy.special import gammainc, gammaincc
from scipy.stats import gamma as gamma_dist, kstest

from raysim.core.rng import stream
from raysim.system import compute_time, speed_factors
from raysim.system.analytic import expected_compute_phase
from raysim.system.compute import gamma_quantile


def _phase_draws(b: int, k: int, reps: int, seed: int, shift: float = 1.0, rate: float = 1.0) -> np.ndarray:
    """`reps` draws of a compute phase: k clients of b calls each, the slowest one ends it."""
    times = compute_time(np.full((reps, k), b), stream(seed, 0, 0, "test"), shift, rate)
    return times.max(axis=1)


def test_zero_calls_take_no_time():
    rng = stream(0, 0, 0, "test")
    assert compute_time(0, rng, 1.0, 1.0) == 0.0
    assert np.all(compute_time(np.array([0, 0]), rng, 3.0, 2.0) == 0.0)


def test_negative_calls_rejected():
    with pytest.raises(ValueError):
        compute_time(-1, stream(0, 0, 0, "test"), 1.0, 1.0)


def test_type_b_mean_2b_variance_b():
    b, reps = 20, 200_000
    t = compute_time(np.full(reps, b), stream(1, 0, 0, "test"), 1.0, 1.0)
    # 4 s.e.: s.e.(mean) = sqrt(b/reps); s.e.(var) = b*sqrt((2 + 6/b)/reps) (Gamma kurtosis 6/b).
    assert abs(t.mean() - 2 * b) < 4 * math.sqrt(b / reps)
    assert abs(t.var() - b) < 4 * b * math.sqrt((2 + 6 / b) / reps)


@pytest.mark.parametrize(
    "b, k, reps, table",
    [
        (5, 100, 20_000, 17.393),
        (10, 1000, 5_000, 33.528),
        (1, 100, 20_000, 1 + sum(1 / i for i in range(1, 101))),
        (1, 10_000, 500, 1 + sum(1 / i for i in range(1, 10_001))),
    ],
)
def test_compute_phase_mean_matches_quadrature(b, k, reps, table):
    exact = expected_compute_phase(b, k)
    assert exact == pytest.approx(table, abs=1e-3)
    draws = _phase_draws(b, k, reps, seed=b * k)
    # 4 s.e. of the Monte Carlo mean, s.e. = sample sd / sqrt(reps).
    assert abs(draws.mean() - exact) < 4 * draws.std(ddof=1) / math.sqrt(reps)


def test_compute_phase_with_shift_and_rate():
    b, k, reps, shift, rate = 5, 50, 20_000, 0.5, 2.0
    draws = _phase_draws(b, k, reps, seed=7, shift=shift, rate=rate)
    # 4 s.e. of the Monte Carlo mean.
    assert abs(draws.mean() - expected_compute_phase(b, k, shift, rate)) < 4 * draws.std(ddof=1) / math.sqrt(reps)


def test_speed_divides_time():
    slow = compute_time(7, stream(3, 2, 1, "compute"), 1.0, 1.0)
    fast = compute_time(7, stream(3, 2, 1, "compute"), 1.0, 1.0, speed=2.5)
    assert fast == pytest.approx(slow / 2.5, rel=1e-15)


def test_speed_factors_do_not_depend_on_federation_size():
    small, large = speed_factors(5, 0.7, seed=11), speed_factors(40, 0.7, seed=11)
    assert np.array_equal(small, large[:5])
    assert np.all(speed_factors(6, 0.0, seed=11) == 1.0)


def test_speed_factors_are_lognormal():
    sigma, n = 0.5, 4000
    logs = np.log(speed_factors(n, sigma, seed=2))
    # 4 s.e.: s.e.(mean) = sigma/sqrt(n); s.e.(sd) ~ sigma/sqrt(2n).
    assert abs(logs.mean()) < 4 * sigma / math.sqrt(n)
    assert abs(logs.std() - sigma) < 4 * sigma / math.sqrt(2 * n)


def test_gamma_quantile_inverts_the_incomplete_gamma_in_both_tails():
    """P(a, x) = u (lower tail) and Q(a, x) = 1 - u (upper tail) to 1e-11 relative, shapes 1/2 to 1e6
    and u from 1e-150 to 1 - 2^-53, through the forward functions gammainc / gammaincc."""
    shape, u = np.meshgrid([0.5, 1, 2, 3.7, 5, 20, 100, 1e3, 1e4, 1e6],
                           [1e-150, 1e-12, 1e-6, 0.01, 0.3, 0.5, 0.5 + 1e-7, 0.9, 1 - 1e-6, 1 - 1e-12, 1 - 2**-53])
    x = gamma_quantile(shape, u)
    lower = u <= 0.5
    np.testing.assert_allclose(gammainc(shape, x)[lower], u[lower], rtol=1e-11, atol=0)
    np.testing.assert_allclose(gammaincc(shape, x)[~lower], 1 - u[~lower], rtol=1e-11, atol=0)
    assert np.all(gamma_quantile(np.array([0.0, 4.0]), np.array([0.7, 0.0])) == 0.0)


def test_gamma_quantile_is_elementwise():
    """Each element's value is the one it has alone: independent of position, order and batch size."""
    rng = stream(11, 0, 0, "test")
    shape, u = rng.integers(1, 300, 257).astype(float), rng.random(257)
    batch = gamma_quantile(shape, u)
    alone = np.array([gamma_quantile(shape[i:i + 1], u[i:i + 1])[0] for i in range(257)])
    order = rng.permutation(257)
    assert np.array_equal(batch, alone) and np.array_equal(gamma_quantile(shape[order], u[order]), batch[order])


@pytest.mark.parametrize("shape, u", [(3.0, np.nan), (3.0, 1.0), (3.0, -0.1), (np.nan, 0.5), (-1.0, 0.5), (np.inf, 0.5)])
def test_gamma_quantile_rejects_invalid_inputs(shape, u):
    with pytest.raises(ValueError):
        gamma_quantile(np.array([shape]), np.array([u]))


def test_compute_time_is_erlang_by_kolmogorov_smirnov():
    """20,000 draws of Erlang(7, rate 2) + 7 * 0.5: the KS test against scipy's Gamma does not reject at 1%."""
    t = compute_time(np.full(20_000, 7), stream(5, 0, 0, "test"), 0.5, 2.0)
    assert kstest(t - 3.5, gamma_dist(7, scale=0.5).cdf).pvalue > 0.01
