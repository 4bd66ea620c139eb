"""Build an experiment's algorithm the same way in the driver, the actors and unit tests."""
from __future__ import annotations

from raysim.config import ExperimentConfig
from raysim.contract import Algorithm, Context
from raysim.data import FederatedData
from raysim.registry import get_algorithm


def make_context(cfg: ExperimentConfig, data: FederatedData, device: str = "cpu") -> Context:
    """The algorithm's view of the experiment."""
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
        params=cfg.algorithm_params(),
        device=device,
        train_path=data.train_path,
        target_shape=tuple(data.target_shape),
        partition_seed=cfg.data.partition_seed,
    )


def make_algorithm(cfg: ExperimentConfig, data: FederatedData, device: str = "cpu") -> Algorithm:
    """Instantiate the configured algorithm (a class shipped to an actor is `adopt`ed first)."""
    return get_algorithm(cfg.algorithm.name)(make_context(cfg, data, device))
