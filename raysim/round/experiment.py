"""A validated experiment as it travels: built once in the driver, the same in every process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from raysim import plugins
from raysim.config import ExperimentConfig
from raysim.contract import Algorithm, Context
from raysim.data import FederatedData
from raysim.errors import ConfigError


@dataclass
class Experiment:
    """The driver's validated config, the algorithm's class and validated hyperparameters, and what the
    driver's plugins registered. Actors and Tune trials receive this object (pickled, user code by
    value) instead of text to parse again, and `install` it before any name is looked up."""

    cfg: ExperimentConfig
    algorithm: type
    params: BaseModel
    registrations: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> Experiment:
        """Resolve a validated config in the driver."""
        return cls(cfg, plugins.ALGORITHMS.lookup(cfg.algorithm.name), cfg.algorithm_params(), plugins.snapshot())

    def install(self) -> Experiment:
        """Register the driver's plugins in this process; returns self."""
        plugins.install(self.registrations)
        return self

    def context(self, data: FederatedData, device: str = "cpu") -> Context:
        """The algorithm's view of the experiment."""
        cfg = self.cfg
        return Context(
            seed=cfg.seed,
            rounds=cfg.algorithm.rounds,
            clients_per_round=cfg.clients_to_select(),
            num_clients=data.num_clients,
            client_sizes=data.client_sizes,
            feature_shape=tuple(data.feature_shape),
            image_shape=tuple(data.image_shape) if data.image_shape else None,
            num_classes=data.num_classes,
            model=cfg.model,
            params=self.params,
            device=device,
            train_path=data.train_path,
            target_shape=tuple(data.target_shape),
            partition_seed=cfg.data.partition_seed,
            privacy=cfg.privacy,
            kept_per_round=cfg.algorithm.clients_per_round,
        )

    def algorithm_for(self, data: FederatedData, device: str = "cpu") -> Algorithm:
        """Instantiate the configured algorithm."""
        return self.algorithm(self.context(data, device))


def check_on(experiment: Experiment, data: FederatedData) -> None:
    """Instantiate the algorithm once on the data, in the driver, before a round or an actor's shard starts: what its
    constructor refuses (a ValueError, as `field: problem`: a model the data's shapes cannot feed, a loss their
    labels do not fit) is a mistake in the input, a ConfigError, not a defect."""
    try:
        experiment.algorithm_for(data)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from e


def make_algorithm(cfg: ExperimentConfig, data: FederatedData, device: str = "cpu") -> Algorithm:
    """The configured algorithm of a config validated in this process (tests, benchmarks, family commands);
    nothing travels, so no plugin snapshot is taken."""
    return Experiment(cfg, plugins.ALGORITHMS.lookup(cfg.algorithm.name), cfg.algorithm_params()).algorithm_for(data, device)
