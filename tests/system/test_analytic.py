import math

import numpy as np
import pytest

from raysim.system.analytic import (
    erlang_cdf,
    erlang_quantile,
    expected_compute_phase,
    expected_explicit_drain,
    expected_max_erlang,
    explicit_queue_bound,
    gumbel_phase_estimate,
    paper_phase_estimate,
    prop2_bounds,
    von_mises_a,
)

# FedLRGD, algorithms/fedlrgd/README.md: b, k, exact b+E max, paper (19), Gumbel form, exact Q.
TABLE = [
    (1, 100, 6.187, 6.605, 6.182, 4.605),
    (1, 10**4, 10.788, 11.210, 10.788, 9.210),
    (2, 1000, 11.863, 10.908, 11.873, 9.233),
    (5, 100, 17.393, 14.605, 17.442, 11.605),
    (5, 10**4, 23.494, 19.210, 23.514, 17.782),
    (10, 1000, 33.528, 26.908, 33.578, 22.657),
    (20, 10**4, 62.020, 49.210, 62.071, 41.031),
    (50, 10**5, 137.286, 111.513, 137.348, 86.049),
]


@pytest.mark.parametrize("b, k, exact, paper, gumbel, q", TABLE)
def test_spec_table(b, k, exact, paper, gumbel, q):
    assert expected_compute_phase(b, k) == pytest.approx(exact, abs=1e-3)
    assert paper_phase_estimate(b, k) == pytest.approx(paper, abs=1e-3)
    assert gumbel_phase_estimate(b, k) == pytest.approx(gumbel, abs=1e-2)
    assert erlang_quantile(b, k) == pytest.approx(q, abs=1e-3)


@pytest.mark.parametrize("k", [1, 2, 100, 10**4, 10**6])
def test_exponential_max_is_harmonic(k):
    assert expected_max_erlang(1, k) == pytest.approx(math.fsum(1 / i for i in range(1, k + 1)), rel=1e-9)


def test_max_erlang_edge_cases_and_rate():
    assert expected_max_erlang(4, 1) == pytest.approx(4.0, rel=1e-9)
    assert expected_max_erlang(0, 10) == 0.0 and expected_max_erlang(3, 0) == 0.0
    assert expected_max_erlang(6, 300, rate=4.0) == pytest.approx(expected_max_erlang(6, 300) / 4, rel=1e-12)
    assert expected_compute_phase(6, 300, shift=0.5, rate=4.0) == pytest.approx(3 + expected_max_erlang(6, 300) / 4)
    # Large b and k stay finite and ordered: the quantile is inside the mean's neighbourhood.
    assert erlang_quantile(1000, 10**6) < expected_max_erlang(1000, 10**6) < erlang_quantile(1000, 10**7)


def test_erlang_cdf_formula_73():
    y, b = np.linspace(0, 15, 31), 4
    closed = 1 - np.exp(-y) * sum(y**j / math.factorial(j) for j in range(b))
    assert np.allclose(erlang_cdf(y, b), closed, atol=1e-14)
    assert np.allclose(erlang_cdf(y, b, rate=3.0), erlang_cdf(3 * y, b), atol=1e-14)


def test_von_mises_a():
    assert von_mises_a(7.0, 1) == 1.0
    assert von_mises_a(2.0, 3) == 1 + 2 / 2 + 2 / 4
    assert von_mises_a(1e6, 5) == pytest.approx(1 + 4e-6, rel=1e-10)


# FedLRGD, algorithms/fedlrgd/README.md: b, q, lower, exact, upper.
PROP2 = [
    (1, 100, 2.298, 4.605, 10.577),
    (5, 10**4, 5.410, 17.782, 41.446),
    (10, 10**6, 8.059, 32.710, 87.546),
    (50, 1000, 5.409, 74.725, 474.331),
]


@pytest.mark.parametrize("b, q, lower, exact, upper", PROP2)
def test_prop2_table(b, q, lower, exact, upper):
    lo, hi = prop2_bounds(b, q)
    assert (lo, erlang_quantile(b, q), hi) == pytest.approx((lower, exact, upper), abs=1e-3)


def test_prop2_holds_on_grid():
    qs = sorted({56, 10**6, *np.unique(np.geomspace(2, 10**6, 80).astype(int)).tolist()})
    checked = 0
    for b in (1, 2, 5, 10, 50):
        for q in qs:
            if (q - 1) * b >= 55:
                lo, hi = prop2_bounds(b, q)
                assert lo <= erlang_quantile(b, q) <= hi, (b, q)
                checked += 1
    assert checked > 300


def test_prop2_requires_its_condition():
    with pytest.raises(ValueError):
        prop2_bounds(1, 55)
    with pytest.raises(ValueError):
        prop2_bounds(5, 11)
    prop2_bounds(5, 12)


def test_explicit_queue_bound_and_exact_drain():
    assert explicit_queue_bound(100, 2.0) == 101.0
    assert explicit_queue_bound(100, 1.25) == pytest.approx(104.0)
    with pytest.raises(ValueError, match="unstable"):
        explicit_queue_bound(10, 1.0)
    assert expected_explicit_drain(1, 3.0) == pytest.approx(1 + 1 / 3)
    for k, nu in [(5, 1.25), (100, 1.25), (100, 2.0)]:
        assert expected_explicit_drain(k, nu) <= explicit_queue_bound(k, nu)
    # Equality in the limit: with nu = 5 the queue forgets its empty start within 1000 arrivals.
    assert expected_explicit_drain(1000, 5.0) == pytest.approx(explicit_queue_bound(1000, 5.0), abs=1e-6)


def test_fedlrgd_expected_wall_clock_example():
    # FedLRGD, algorithms/fedlrgd/README.md: m=50, s=20, r=4, S=23, phi=100 -> 20,397.5 (E max_50 Gamma(80,1) = 101.53).
    m, s, r, big_s, phi = 50, 20, 4, 23, 100
    total = 2 * r**2 + expected_compute_phase(r * s, m) + phi * m * r + 2 * r * big_s
    assert expected_max_erlang(r * s, m) == pytest.approx(101.53, abs=5e-3)
    assert total == pytest.approx(20397.5, abs=0.05)
