import math
import os
import subprocess
import sys

import mpmath
import numpy as np
import pytest
from scipy.special import gammaincinv

from raysim.core.rng import stream
from raysim.system.compute import gamma_quantile
from raysim.system import quantile_table
from raysim.system.quantile_table import _INTERVALS, LOWER_LIMIT, TABLE_SHAPES, _hermite_coefficients, tabled_quantile

SHAPES = [1, 2, 3, 5, 25, 64, TABLE_SHAPES]


def _uniforms(n: int, seed: int) -> np.ndarray:
    """u from LOWER_LIMIT to 1 - 2^-53: `n` spread evenly in log(-log(1 - u)), the table's own variable, where every
    interval is as wide, then both ends."""
    w = stream(seed, 0, 0, "test").uniform(math.log(-math.log1p(-LOWER_LIMIT)), math.log(53 * math.log(2)), n)
    return np.concatenate([-np.expm1(-np.exp(w)), [LOWER_LIMIT, 0.5, 1 - 2.0**-53]])


def _distance(k: int, x: np.ndarray, u: np.ndarray) -> float:
    """The largest relative distance of `x` from the exact quantiles, (Q(k, x) - (1 - u)) / (p(x) x), at 40 digits."""
    with mpmath.workdps(40):
        return max(float(abs((mpmath.gammainc(k, xi, mpmath.inf, regularized=True) - (1 - mpmath.mpf(ui)))
                             * mpmath.gamma(k) / (mpmath.exp(-xi) * mpmath.mpf(xi) ** k)))
                   for xi, ui in zip(x.tolist(), u.tolist()))


@pytest.mark.parametrize("k", SHAPES)
def test_the_interpolated_quantile_is_the_exact_one_to_5e_15(k):
    """Within 5e-15 of the 40-digit quantile (scipy's gammaincinv is within 3e-15), at the elements where it is
    farthest from scipy's among 20,000 over the whole range of u, and at both ends."""
    u = _uniforms(20_000, k)
    x = tabled_quantile(np.full(u.size, k), u)
    far = np.argsort(-np.abs(x / gammaincinv(k, u) - 1))[:15]
    check = np.r_[far, np.arange(u.size - 3, u.size)]
    assert _distance(k, x[check], u[check]) < 5e-15


def test_shape_one_is_the_exponentials_quantile_exactly():
    """-log(1 - u) as scipy's log1p gives it, within two ulps of libm's."""
    from scipy.special import log1p

    u = _uniforms(1000, 1)
    x = tabled_quantile(np.ones(u.size, dtype=np.int64), u)
    assert np.array_equal(x, -log1p(-u))
    np.testing.assert_array_max_ulp(x, np.array([-math.log1p(-ui) for ui in u.tolist()]), maxulp=2)


def test_an_elements_quantile_is_the_same_alone_among_other_shapes_and_in_any_order():
    """The value of (k, u) does not depend on the array it is in."""
    rng = stream(3, 0, 0, "test")
    k, u = rng.integers(1, TABLE_SHAPES + 1, 400), rng.uniform(LOWER_LIMIT, 1, 400)
    mixed = tabled_quantile(k, u)
    alone = np.array([tabled_quantile(k[i:i + 1], u[i:i + 1])[0] for i in range(400)])
    order = rng.permutation(400)
    assert np.array_equal(mixed, alone) and np.array_equal(tabled_quantile(k[order], u[order]), mixed[order])


def test_an_intervals_coefficients_are_the_same_built_alone_or_among_others():
    """Intervals are built as clients first need them, so which others share a build varies from run to run and from
    actor to actor: an interval's coefficients must not depend on them."""
    rng = stream(5, 0, 0, "test")
    k, j = rng.integers(1, TABLE_SHAPES + 1, 200), rng.integers(0, _INTERVALS, 200)
    together = _hermite_coefficients(k, j)
    assert np.array_equal(together, np.concatenate([_hermite_coefficients(k[i:i + 1], j[i:i + 1]) for i in range(200)]))


_PROBE = """
import hashlib, importlib.util, sys
import numpy as np
spec = importlib.util.spec_from_file_location("quantile_table", sys.argv[1])
table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)
rng = np.random.default_rng(4)
k, u = rng.integers(1, table.TABLE_SHAPES + 1, 5000), rng.uniform(table.LOWER_LIMIT, 1, 5000)
print(hashlib.sha256(table.tabled_quantile(k, u).tobytes()).hexdigest(), hashlib.sha256(np.log(u).tobytes()).hexdigest())
"""


def test_the_quantiles_bits_do_not_depend_on_the_simd_numpy_dispatches_to():
    """NumPy's SIMD logarithms differ in their last bit between CPUs; the table's are scalar C. With every dispatchable
    CPU feature off, NumPy's log changes here and the quantiles do not (the module alone, in a fresh interpreter)."""
    module = quantile_table.__file__
    runs = [subprocess.run([sys.executable, "-c", _PROBE, module], capture_output=True, text=True, check=True,
                           env={**os.environ, **extra}).stdout.split()
            for extra in ({}, {"NPY_DISABLE_CPU_FEATURES": _dispatchable_features()})]
    if runs[0][1] == runs[1][1]:
        pytest.skip("NumPy's log is the same at every dispatch level on this CPU: nothing to compare against")
    assert runs[0][0] == runs[1][0]


def _dispatchable_features() -> str:
    """The CPU features NumPy found beyond its build's baseline, which NPY_DISABLE_CPU_FEATURES can turn off."""
    from numpy._core._multiarray_umath import __cpu_baseline__, __cpu_features__

    return " ".join(f for f, on in __cpu_features__.items() if on and f not in __cpu_baseline__)


def test_gamma_quantile_takes_the_table_by_each_elements_own_shape_and_u():
    """Integer shapes up to TABLE_SHAPES at u >= LOWER_LIMIT are the table's; u below it, larger shapes and fractional
    ones are scipy's; the two agree to 5e-15 where both apply."""
    u = np.array([0.3, LOWER_LIMIT / 2, 0.3, 0.3, 0.3])
    shape = np.array([25.0, 25.0, TABLE_SHAPES + 1.0, 2.5, 7.0])
    x = gamma_quantile(shape, u)
    assert x[0] == tabled_quantile(np.array([25]), np.array([0.3]))[0]
    assert np.array_equal(x[1:4], gammaincinv(shape[1:4], u[1:4]))
    np.testing.assert_allclose(x, gammaincinv(shape, u), rtol=5e-15)
