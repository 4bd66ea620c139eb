"""The `algorithm.objective:` sub-config of the zeroth-order families, and the objective it builds.

Objective settings live with the algorithm (not under `data:`, whose schema is fixed): the
synthetic objectives are generated from the experiment seed in every process, so nothing is
sent per round; the data-based ones (metric, attack) read the clients' rows of train.parquet.
"""
from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from raysim.contract import Context
from raysim.algorithms.fzoos.model_objectives import AttackObjective, MetricObjective
from raysim.algorithms.fzoos.objectives import SYNTHETIC, Objective


class SyntheticObjective(BaseModel):
    """The quadratic of Sec. 6.1, eq. (98) (d=300, N=5, C in {0.5, 5, 50}) or its Ackley/Levy variants."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["quadratic", "ackley", "levy"] = "quadratic"
    dim: int = Field(300, ge=2, description="d")
    heterogeneity: float = Field(5.0, ge=0, description="C: larger is more heterogeneous")
    noise_std: float = Field(0.0, ge=0, description="std of the Gaussian observation noise of a query (0: the official code's)")


class MetricObjectiveConfig(BaseModel):
    """1 - metric of a perturbed pretrained classifier (Sec. 6.3); the classifier is the `model:` section."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["metric"]
    metric: Literal["precision", "recall", "f1", "jaccard"] = "precision"
    perturbation: float = Field(0.2, gt=0, description="u in [0,1]^d maps to a perturbation in [-r, r]")
    pretrain_steps: int = Field(300, ge=1)
    pretrain_lr: float = Field(0.01, gt=0)
    noise_std: float = Field(0.0, ge=0)


class AttackObjectiveConfig(BaseModel):
    """Black-box attack on the clients' own models (Sec. 6.2); each model is the `model:` section."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["attack"]
    perturbation: float = Field(0.3, gt=0, description="u in [0,1]^d maps to a pixel perturbation in [-r, r]")
    image: int = Field(0, ge=0, description="which valid held-out image (the paper's trial index)")
    train_steps: int = Field(300, ge=1)
    train_lr: float = Field(0.01, gt=0)
    start: Literal["zero", "lower"] = Field("zero", description="u0 = 0.5 (no perturbation) or the code's u0 = 0")
    noise_std: float = Field(0.0, ge=0)


ObjectiveConfig = Union[SyntheticObjective, MetricObjectiveConfig, AttackObjectiveConfig]

_BUILT: dict[tuple, Objective] = {}


def build_objective(cfg: ObjectiveConfig, ctx: Context) -> Objective:
    """The objective of `cfg` for this experiment (built once per process: models are trained here)."""
    if isinstance(cfg, SyntheticObjective):
        return SYNTHETIC[cfg.kind](cfg.dim, ctx.num_clients, cfg.heterogeneity, ctx.seed)
    if isinstance(cfg, MetricObjectiveConfig):
        return MetricObjective(ctx, cfg.metric, cfg.perturbation, cfg.pretrain_steps, cfg.pretrain_lr)
    return AttackObjective(ctx, cfg.perturbation, cfg.image, cfg.train_steps, cfg.train_lr, cfg.start)


def objective_for(cfg: ObjectiveConfig, ctx: Context) -> Objective:
    """`build_objective`, cached per process by everything it depends on."""
    key = (cfg.model_dump_json(), ctx.seed, ctx.num_clients, str(ctx.train_path), ctx.model.model_dump_json())
    if key not in _BUILT:
        _BUILT[key] = build_objective(cfg, ctx)
    return _BUILT[key]
