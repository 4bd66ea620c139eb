"""The runtime's compiled kernels (numba: the host's batch plans, the reduction tree's sums): when they take a call,
from COMPILED_MIN clients (below it NumPy and torch serve, the same numbers, so a run of small rounds never pays
numba's import and the kernels' load, 0.3-0.5 s once a process, a few seconds the first time they compile), and how
they are compiled (`jit`)."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

COMPILED_MIN = 2048
F = TypeVar("F", bound=Callable[..., Any])
_UNCACHED: set[str] = set()  # the modules whose kernels numba could not cache (warned once each)
_SHARE: int | None = None  # the host threads this process's parallel kernels may take (None: numba's count)


def use_host_threads(share: int | None) -> None:
    """Cap the threads this process's parallel kernels take at `share`, its CPU share (None: numba's own count, every
    core). A client actor sets it as it sets its torch threads: by default a node runs an actor per CPU, and each
    one's kernel on every core would put a node's cores squared to work at once."""
    global _SHARE
    _SHARE = share


def host_threads(available: int) -> int:
    """The threads a parallel kernel takes of numba's `available`: at most the process's CPU share, at least one."""
    return max(1, available if _SHARE is None else min(available, _SHARE))


def jit(**options: Any) -> Callable[[F], F]:
    """numba.njit(nogil=True, cache=True, **options): a kernel that holds no interpreter lock, compiled once and then
    loaded from numba's cache (`__pycache__` beside its module, else the user's cache directory). Where neither can be
    written (a read-only install and home), numba refuses `cache=True` at the decorator; the kernel then compiles in
    each process that uses it (some seconds, once) instead of failing the import, with a warning."""
    import numba

    def wrap(fn: F) -> F:
        try:
            return numba.njit(nogil=True, cache=True, **options)(fn)
        except RuntimeError as err:  # numba: "cannot cache function ...: no locator available for file ..."
            if "no locator available" not in str(err):
                raise
            if fn.__module__ not in _UNCACHED:
                _UNCACHED.add(fn.__module__)
                warnings.warn(f"raysim: numba has nowhere to cache {fn.__module__}'s kernels (set NUMBA_CACHE_DIR to a "
                              "writable directory): they compile in every process", RuntimeWarning, stacklevel=2)
            return numba.njit(nogil=True, **options)(fn)
    return wrap
