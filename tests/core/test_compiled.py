"""How the runtime's kernels are compiled: cached where numba can write its cache, compiled in the process (with one
warning a module) where it cannot, instead of an import that fails."""
import warnings

import numba.core.caching
import numba.core.config
import numpy as np
import pytest

from raysim.core import compiled


def _total(x):
    s = 0.0
    for v in x:
        s += v
    return s


def test_a_kernel_is_cached_where_numba_can_write_its_cache():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernel = compiled.jit()(_total)
    assert not isinstance(kernel._cache, numba.core.caching.NullCache) and kernel(np.arange(5.0)) == 10.0


def test_a_kernel_compiles_uncached_with_one_warning_where_numba_has_nowhere_to_cache_it(monkeypatch):
    monkeypatch.setattr(numba.core.config, "CACHE_LOCATOR_CLASSES", "ZipCacheLocator")  # locates no plain file
    monkeypatch.setattr(compiled, "_UNCACHED", set())
    with pytest.warns(RuntimeWarning, match="nowhere to cache") as caught:
        kernels = [compiled.jit()(_total), compiled.jit(inline="always")(_total)]
    assert len(caught) == 1 and all(k(np.arange(5.0)) == 10.0 for k in kernels)
    assert all(isinstance(k._cache, numba.core.caching.NullCache) for k in kernels)
