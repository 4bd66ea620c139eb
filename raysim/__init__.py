"""raysim: a Ray-based simulation cluster for federated optimization research."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from raysim.callbacks import Callback, RunContext, ServerView
from raysim.config import ConfigError, ExperimentConfig, load_config
from raysim.contract import Algorithm, ClientData, Context, Cost, EvalData, Plan
from raysim.core.distribution import installed_version
from raysim.plugins import register_algorithm
from raysim.results import RunResult

__all__ = ["Algorithm", "Callback", "ClientData", "ConfigError", "Context", "Cost", "EvalData", "ExperimentConfig", "Plan",
           "RunContext", "RunResult", "ServerView", "__version__", "load_config", "register_algorithm", "run", "trained_model"]

__version__ = installed_version()


def run(config: str | Path | dict[str, Any] | ExperimentConfig | None, overrides: list[str] | dict[str, Any] | None = None,
        *, address: str | None = None, out: str | Path | None = None, progress: bool = True,
        on_round: Callable[[dict[str, Any]], bool | None] | None = None, resume: str | Path | None = None,
        callbacks: list[Callback] | None = None, overwrite: bool = False, **kw_overrides: Any) -> RunResult:
    """Run an experiment (a YAML path, a dict or an ExperimentConfig; None with `resume=`); see `raysim.runner.run`.
    `kw_overrides` are overrides with `__` for dots (`algorithm__lr=0.1`). Progress shows on stderr (a bar on a
    terminal or in Jupyter, a line every 10 s otherwise); `progress=False` silences it."""
    from raysim.runner import run as _run

    return _run(config, overrides, address=address, out=out, progress=progress, on_round=on_round, resume=resume,
                callbacks=callbacks, overwrite=overwrite, **kw_overrides)


def trained_model(run_dir: str | Path, best: bool = False) -> Any:
    """A finished run's trained model (an nn.Module for torch families, else {name: array}) after its newest
    checkpoint, or after the best round kept by the best_model callback; see `raysim.results.export.trained_model`."""
    from raysim.results.export import trained_model as _trained

    return _trained(run_dir, best).model
