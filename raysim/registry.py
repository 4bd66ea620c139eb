"""Registries of algorithm families: a new algorithm registers itself without editing the runtime.

Built-in families live in `raysim.algorithms`; third-party packages add theirs through the
`raysim.algorithms` entry-point group, or by calling `register_algorithm` before `raysim.run`.
"""
from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points

ALGORITHMS: dict[str, type] = {}
_loaded = False


def register_algorithm(name: str):
    """Class decorator: make an `Algorithm` subclass available as `algorithm.name: <name>`."""

    def wrap(cls):
        if cls.Params is None:
            raise TypeError(f"algorithm {name!r} must define a pydantic `Params` class")
        ALGORITHMS[name] = cls
        cls.name = name
        return cls

    return wrap


def algorithms() -> dict[str, type]:
    """All registered algorithms: the built-in families, then entry points."""
    global _loaded
    if not _loaded:
        _loaded = True
        import raysim.algorithms  # noqa: F401  (registers the built-in families)

        for ep in entry_points(group="raysim.algorithms"):
            ep.load()
    return ALGORITHMS


def check_registered(what: str, name: str, allowed: Iterable[str]) -> str:
    """`name` if it is among `allowed`, else a ValueError that lists what is."""
    allowed = sorted(allowed)
    if name not in allowed:
        raise ValueError(f"unknown {what} {name!r}; allowed: {allowed}")
    return name


def get_algorithm(name: str) -> type:
    """The algorithm class registered as `name`, or a ValueError listing what exists."""
    algos = algorithms()
    try:
        return algos[check_registered("algorithm", name, algos)]
    except ValueError as e:
        raise ValueError(f"algorithm.name: {e}") from None


def adopt(cls: type | None) -> None:
    """Register a class shipped by value to a worker process, where its decorator never ran."""
    if cls is not None:
        ALGORITHMS.setdefault(cls.name, cls)
