"""Registries of algorithm families: a new algorithm registers itself without editing the runtime.

Built-in families live in `raysim.algorithms`; third-party packages add theirs through the
`raysim.algorithms` entry-point group, or by calling `register_algorithm` before `raysim.run`.
"""
from __future__ import annotations

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


def get_algorithm(name: str) -> type:
    """The algorithm class registered as `name`, or a ValueError listing what exists."""
    algos = algorithms()
    if name not in algos:
        raise ValueError(f"algorithm.name: unknown algorithm {name!r}; allowed: {sorted(algos)}")
    return algos[name]


def adopt(cls: type | None) -> None:
    """Register a class shipped by value to a worker process, where its decorator never ran."""
    if cls is not None:
        ALGORITHMS.setdefault(cls.name, cls)
