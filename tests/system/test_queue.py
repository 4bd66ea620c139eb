import math

import numpy as np
import pytest

from raysim.core.rng import SERVER, stream
from raysim.system import CarriedQueue, burke_completions, explicit_completions, mm1_sojourn_times
from raysim.system.analytic import expected_explicit_drain, explicit_queue_bound


def _drains(fn, sizes, reps: int, seed: int, **kw) -> np.ndarray:
    """`reps` independent drain times (last completion) of one upload phase."""
    return np.array([fn(sizes, rng=stream(seed, r, SERVER, "upload"), **kw).max() for r in range(reps)])


def test_burke_mean_and_variance():
    k, phi, reps = 100, 2.5, 20_000
    d = _drains(burke_completions, np.ones(k), reps, seed=1, phi=phi)
    # 4 s.e.: s.e.(mean) = phi*sqrt(k/reps); s.e.(var) = phi^2*k*sqrt((2 + 6/k)/reps).
    assert abs(d.mean() - phi * k) < 4 * phi * math.sqrt(k / reps)
    assert abs(d.var() - phi**2 * k) < 4 * phi**2 * k * math.sqrt((2 + 6 / k) / reps)


def test_burke_fractional_uploads_pro_rata():
    k, frac, phi, reps = 40, 0.25, 1.0, 20_000
    d = _drains(burke_completions, np.full(k, frac), reps, seed=2, phi=phi)
    n = k * frac  # the drain is phi*Gamma(k*frac, 1)
    # 4 s.e. of the mean, s.e. = phi*sqrt(n/reps).
    assert abs(d.mean() - phi * n) < 4 * phi * math.sqrt(n / reps)


def test_burke_structure():
    sizes = np.array([1.0, 0.0, 1.0, 2.0, 0.0, 1.0])
    out = burke_completions(sizes, 3.0, stream(0, 0, SERVER, "upload"))
    assert np.all(out[sizes == 0] == 0.0) and np.all(out[sizes > 0] > 0)
    assert len(set(out[sizes > 0])) == 4  # one upload at a time: distinct completions


def test_burke_order_is_uniform():
    k, reps = 10, 20_000
    ranks = np.array(
        [np.argsort(np.argsort(burke_completions(np.ones(k), 1.0, stream(3, r, SERVER, "upload"))))[0] for r in range(reps)]
    )
    # client 0's rank is uniform on 0..k-1: mean (k-1)/2, sd sqrt((k^2-1)/12); 4 s.e.
    assert abs(ranks.mean() - (k - 1) / 2) < 4 * math.sqrt((k * k - 1) / 12 / reps)


def test_explicit_matches_lindley_loop():
    sizes = np.array([1.0, 0.5, 0.0, 2.0, 1.0, 1.0, 0.0, 3.0])
    phi, nu = 1.7, 1.6
    got = explicit_completions(sizes, phi, nu, stream(5, 1, SERVER, "upload"))
    rng = stream(5, 1, SERVER, "upload")  # replay the same draws through a plain FIFO loop
    order = rng.permutation(np.flatnonzero(sizes > 0))
    arrivals = np.cumsum(rng.exponential(1.0, order.size))
    service = rng.gamma(sizes[order], 1.0 / nu)
    want, free = np.zeros_like(sizes), 0.0
    for c, a, s in zip(order, arrivals, service):
        free = max(a, free) + s
        want[c] = phi * free
    assert np.allclose(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("nu, spec, spec_se", [(2.0, 100.95, 0.16), (1.25, 103.67, 0.15)])
def test_explicit_from_empty(nu, spec, spec_se):
    k, reps = 100, 10_000
    exact = expected_explicit_drain(k, nu)
    # The reference value is itself Monte Carlo: agree within 4 of its quoted s.e.
    assert abs(exact - spec) < 4 * spec_se
    assert exact <= explicit_queue_bound(k, nu)
    d = _drains(explicit_completions, np.ones(k), reps, seed=int(nu * 100), phi=1.0, nu=nu)
    se = d.std(ddof=1) / math.sqrt(reps)
    # 4 s.e. of the Monte Carlo mean.
    assert abs(d.mean() - exact) < 4 * se
    assert d.mean() <= explicit_queue_bound(k, nu) + 4 * se


def test_explicit_scales_with_phi():
    sizes = np.ones(30)
    one = explicit_completions(sizes, 1.0, 3.0, stream(9, 0, SERVER, "upload"))
    ten = explicit_completions(sizes, 10.0, 3.0, stream(9, 0, SERVER, "upload"))
    assert np.allclose(ten, 10 * one, rtol=1e-14)


@pytest.mark.parametrize("nu", [2.0, 4.0])
def test_steady_state_sojourn_mean(nu):
    reps, n, burn = 20, 20_000, 1_000
    means = np.array([mm1_sojourn_times(n, nu, stream(4, r, 0, "mm1"))[burn:].mean() for r in range(reps)])
    # 4 s.e. over independent replications (the sojourns within one are correlated).
    assert abs(means.mean() - 1 / (nu - 1)) < 4 * means.std(ddof=1) / math.sqrt(reps)


@pytest.mark.parametrize("fn, kw", [(burke_completions, {"phi": 1.0}), (explicit_completions, {"phi": 1.0, "nu": 2.0})])
def test_negative_sizes_rejected_and_empty_ok(fn, kw):
    with pytest.raises(ValueError):
        fn(np.array([1.0, -1.0]), rng=stream(0, 0, SERVER, "upload"), **kw)
    assert fn(np.array([]), rng=stream(0, 0, SERVER, "upload"), **kw).size == 0


def test_explicit_queue_starts_each_round_empty():
    # The first upload of a round finds no backlog: it completes after one Exp(1) arrival gap and its
    # own Exp(nu) service, mean phi*(1 + 1/nu); a carried backlog would add the previous round's residual work.
    nu, phi, k, reps = 1.25, 2.0, 50, 20_000
    firsts = np.array([explicit_completions(np.ones(k), phi, nu, stream(11, r, SERVER, "upload")).min()
                       for r in range(reps)])
    mean, sd = phi * (1 + 1 / nu), phi * math.sqrt(1 + 1 / nu**2)  # sum of two independent exponentials
    assert abs(firsts.mean() - mean) < 4 * sd / math.sqrt(reps)  # 4 s.e.


@pytest.mark.parametrize("lam, nu", [(0.5, 1.0), (3.0, 4.0)])
def test_the_carried_queue_sojourn_is_mm1s_in_steady_state(lam, nu):
    """Poisson(lambda) arrivals and Exp(nu) services through the queue that carries its backlog: the mean sojourn is
    1/(nu - lambda) (M/M/1). The first 10% are a warm-up; the tolerance is 5 standard errors of the batch means."""
    n, rng = 400_000, stream(5, 0, SERVER, "carried")
    arrivals = np.cumsum(rng.exponential(1 / lam, n))
    services = rng.exponential(1 / nu, n)
    q = CarriedQueue()
    sojourn = np.array([q.depart(a, s) for a, s in zip(arrivals.tolist(), services.tolist())]) - arrivals
    batches = sojourn[n // 10:].reshape(90, -1).mean(1)  # batch means: the sojourns are correlated
    se = batches.std(ddof=1) / math.sqrt(batches.size)
    assert abs(batches.mean() - 1 / (nu - lam)) < 5 * se
    assert se < 0.05 / (nu - lam)  # the check has power: 5 s.e. within 25% of the mean
