"""raysim: a Ray-based simulation cluster for federated optimization research."""
from raysim.callbacks import Callback, RunContext, ServerView
from raysim.config import ConfigError, ExperimentConfig, load_config
from raysim.contract import Algorithm, ClientData, Context, Cost, EvalData, Plan
from raysim.distribution import installed_version
from raysim.plugins import register_algorithm
from raysim.results import RunResult

__all__ = ["Algorithm", "Callback", "ClientData", "ConfigError", "Context", "Cost", "EvalData", "ExperimentConfig", "Plan",
           "RunContext", "RunResult", "ServerView", "__version__", "load_config", "register_algorithm", "run", "trained_model"]

__version__ = installed_version()


def run(config, overrides=None, **kwargs) -> RunResult:
    """Run an experiment (a YAML path, a dict or an ExperimentConfig); see `raysim.runner.run`."""
    from raysim.runner import run as _run

    return _run(config, overrides, **kwargs)


def trained_model(run_dir, best: bool = False):
    """A finished run's trained model (an nn.Module for torch families, else {name: array}) after its newest
    checkpoint, or after the best round kept by the best_model callback; see `raysim.export.trained_model`."""
    from raysim.export import trained_model as _trained

    return _trained(run_dir, best).model
