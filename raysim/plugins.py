"""The plugin registry: algorithms, data sources, partitioners, models, CLI commands and reports.

A plugin is a module whose import registers things here. The built-in families are plugins
declared as entry points (group `raysim.plugins` in pyproject.toml) and imported on a lookup that
misses, one at a time until the name is found, so a process imports only the runtime and the
families it uses. A user's plugin is named in
the config (`plugins: [my_module, path/to/file.py]`), with `--plugin`, or registered in the driver
script. `snapshot()` collects what was registered outside raysim; the driver ships it by value with
the validated experiment, and `install()` registers it in every other process (server, client
actors, Tune trials, other nodes) before any name is looked up there.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

from raysim.errors import PluginError

if TYPE_CHECKING:
    from raysim.contract import Algorithm

ENTRY_POINTS = "raysim.plugins"
T = TypeVar("T")
A = TypeVar("A", bound="type[Algorithm]")


class Registry(dict[str, Any]):
    """Names -> objects of one kind; a lookup of a missing name first loads the built-in plugins."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def names(self, *extra: str) -> list[str]:
        """Every registered name (built-ins loaded), plus `extra` names the caller allows."""
        load_builtin()
        return sorted({*self, *extra})

    def check(self, name: str, *extra: str) -> str:
        """`name` if it is registered (or among `extra`), else a ValueError that lists what is. On a
        miss, built-in plugins are imported one at a time until one registers `name`."""
        if name not in self and name not in extra:
            load_builtin(lambda: name in self)
        if name not in self and name not in extra:
            allowed = self.names(*extra)
            if name not in allowed:
                raise ValueError(f"unknown {self.kind} {name!r}; allowed: {allowed}")
        return name

    def lookup(self, name: str) -> Any:
        """The object registered as `name` (built-ins loaded on a miss), or a ValueError listing what exists."""
        return self[self.check(name)]

    def add(self, name: str, obj: Any, replace: bool = False) -> None:
        """Register `obj` as `name` (see `claim`). A plugin's name is first looked for among the built-ins, which
        load lazily, so that a built-in of that name is there to refuse it (and cannot load over it later)."""
        if not _is_builtin(obj):
            load_builtin(lambda: name in self)
        elif name in self and not _is_builtin(self[name]):
            return  # a plugin's replacement, installed from the driver's snapshot before this built-in loaded here
        claim(self, self.kind, name, obj, replace)


def claim(registry: dict[str, Any], kind: str, name: str, obj: Any, replace: bool = False) -> None:
    """`registry[name] = obj`; a PluginError naming the owner when another module's object has the name, unless
    `replace`. The same code registered again (a module imported twice) is not another module's."""
    old = registry.get(name)
    if old is not None and not replace and _origin(old) != _origin(obj):
        raise PluginError(f"{kind} {name!r} is already registered by module {_module(old)}; register with"
                          " replace=True to take its name")
    registry[name] = obj


ALGORITHMS = Registry("algorithm")
SOURCES = Registry("source")
PARTITIONERS = Registry("partitioner")
MODELS = Registry("model")
KINDS: dict[str, Registry] = {"algorithms": ALGORITHMS, "sources": SOURCES, "partitioners": PARTITIONERS, "models": MODELS}
COMMAND_MODULES: list[str] = []  # modules whose import registers `raysim` subcommands (imported by the CLI only)
REPORT_MODULES: list[str] = []  # modules whose import registers reporters (imported by `raysim report` only)
_pending: list[EntryPoint] | None = None  # entry points not imported yet (None: not listed yet)


def register_algorithm(name: str, replace: bool = False) -> Callable[[A], A]:
    """Class decorator: make an `Algorithm` subclass available as `algorithm.name: <name>`; `replace` to take
    the name of another module's algorithm (a built-in's, say), which is refused otherwise."""

    def wrap(cls: A) -> A:
        if getattr(cls, "Params", None) is None:
            raise TypeError(f"algorithm {name!r} must define a pydantic `Params` class")
        ALGORITHMS.add(name, cls, replace)
        cls.name = name
        return cls

    return wrap


COMMANDS: dict[str, Callable[..., Any]] = {}


def register_command(name: str | None = None, replace: bool = False) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator: a typer command function becomes `raysim <name>` (default: the function's name); `replace` to
    take the name of another module's command."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        claim(COMMANDS, "command", name or fn.__name__.replace("_", "-"), fn, replace)
        return fn

    return wrap


def declare(commands: Iterable[str] = (), reports: Iterable[str] = ()) -> None:
    """Name a plugin's command and report modules: imported only where used (the CLI, `raysim report`),
    so actors never pay for typer or matplotlib."""
    COMMAND_MODULES.extend(m for m in commands if m not in COMMAND_MODULES)
    REPORT_MODULES.extend(m for m in reports if m not in REPORT_MODULES)


def load_builtin(found: Callable[[], bool] | None = None) -> None:
    """Import the plugins declared as entry points (the built-in families, installed third-party ones),
    in name order, until `found()` holds (None: all of them), so a run imports only the family it uses."""
    global _pending
    if _pending is None:
        _pending = sorted(entry_points(group=ENTRY_POINTS), key=lambda e: e.name)
    while _pending and not (found is not None and found()):
        _pending.pop(0).load()


def load_plugin(spec: str) -> ModuleType:
    """Import a user's plugin: a module name (`my_plugin`) or a Python file (`plugins/mine.py`)."""
    if spec.endswith(".py") or "/" in spec or "\\" in spec:
        path = Path(spec).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"plugin {spec!r}: no such file")
        name = f"raysim_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)  # type: ignore[union-attr]
        except (Exception, SystemExit) as e:
            del sys.modules[name]
            raise PluginError(f"plugin {spec!r}: {_import_problem(e)}") from e
        return module
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name and spec.startswith(e.name):
            raise PluginError(f"plugin {spec!r}: no module of that name (give a module on sys.path or a .py file)") from None
        raise PluginError(f"plugin {spec!r}: {_import_problem(e)}") from e
    except (Exception, SystemExit) as e:  # a plugin's sys.exit() would end raysim without a word
        raise PluginError(f"plugin {spec!r}: {_import_problem(e)}") from e


def _import_problem(err: BaseException) -> str:
    """What went wrong importing a plugin, in a phrase (with file and line for a syntax error)."""
    if isinstance(err, PluginError):  # a registration refused (claim): the message says which
        return str(err)
    if isinstance(err, SystemExit):
        return f"importing it called sys.exit({err.code!r})"
    if isinstance(err, SyntaxError):
        return f"importing it failed: SyntaxError: {err.msg} ({Path(err.filename or '?').name}, line {err.lineno})"
    return f"importing it failed: {type(err).__name__}: {err}"


def _code(obj: Any) -> Any:
    """The registered function or class itself, under any wrapper that sets `__wrapped__` (a block source's)."""
    return inspect.unwrap(obj) if callable(obj) else obj


def _module(obj: Any) -> str:
    return getattr(_code(obj), "__module__", None) or "?"


def _origin(obj: Any) -> tuple[str, Any]:
    """(file, qualified name) of registered code: the same when its module is imported again, or under another name
    (a plugin file given by path and imported as a module too); the object itself for what has no qualified name."""
    code, module = _code(obj), sys.modules.get(_module(obj))
    where = getattr(module, "__file__", None)
    return os.path.realpath(where) if where else _module(obj), getattr(code, "__qualname__", None) or code


def _is_builtin(obj: Any) -> bool:
    return _module(obj).startswith("raysim.")


def snapshot() -> dict[str, dict[str, Any]]:
    """What was registered outside raysim (a driver script, a notebook, a user's plugin), by kind.

    Their modules are marked to pickle by value, so a process that never imported them (an actor, a
    Tune trial, another node) receives the code itself, not a reference it could not resolve.
    """
    import ray.cloudpickle

    shot: dict[str, dict[str, Any]] = {}
    for kind, registry in KINDS.items():
        mine = {n: obj for n, obj in registry.items() if not _is_builtin(obj)}
        for obj in mine.values():
            module = sys.modules.get(_module(obj))
            if module is not None and module.__name__ != "__main__":
                ray.cloudpickle.register_pickle_by_value(module)
        if mine:
            shot[kind] = mine
    return shot


def install(shot: dict[str, dict[str, Any]]) -> None:
    """Register a driver's `snapshot()` in this process (before any lookup)."""
    for kind, entries in shot.items():
        KINDS[kind].update(entries)
