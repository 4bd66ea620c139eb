"""What every federated zeroth-order family shares (the FZooS paper Algo. 1 and 2, and the official code's options).

A communication round is one raysim round per phase: "local" (T local steps from the broadcast
x_{r-1}, upload x_{r,T}^(i), the server averages into x_r) and, for families with a second
synchronisation, a phase that uploads something computed at x_r (FZooS's RFF weights,
SCAFFOLD-I's control variates). `algorithm.rounds` therefore counts phases; the metric
`zo_round` counts communication rounds. Queries are the Cost's oracle calls; uploads are counted
in floats (8 bytes each, upload_vectors in units of d). Replies are averaged in client order,
never pre-reduced, so a seed gives bit-identical trajectories whatever the actor layout.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from raysim.algorithms.fzoos.config import ObjectiveConfig, SyntheticObjective, objective_for
from raysim.algorithms.fzoos.model_objectives import AttackObjective
from raysim.algorithms.fzoos.optim import LocalOptimizer
from raysim.contract import Algorithm, Context, Cost, EvalData, Plan
from raysim.core.sampling import sample_clients
from raysim.errors import ConfigError

FLOAT_BYTES = 8


class ZOParams(BaseModel):
    """Settings shared by the zeroth-order families (defaults: the FZooS paper's)."""

    model_config = ConfigDict(extra="forbid")

    objective: ObjectiveConfig = Field(default_factory=SyntheticObjective)
    local_steps: int = Field(10, ge=1, description="T")
    lr: float = Field(0.01, gt=0)
    optimizer: Literal["adam", "sgd"] = "adam"
    clip_iterates: bool = Field(True, description="project iterates onto [0,1]^d (False: the code's behaviour)")
    server_accept_if_improves: bool = Field(False, description="the official code's acceptance step, not the paper's; "
                                            "charges N queries a round")
    track_cosine: bool = Field(False, description="log cos(g_hat, grad F) per local step (Fig. 4; synthetic only)")


@dataclass
class ZOState:
    """The server's state: the iterate, F there (kept up to date only by the acceptance step), the round
    counters, the participants of the current round, the family's shared vector, the last round's cosines."""

    x: Tensor
    value: float
    zo_round: int = 0
    phase: int = 0
    clients: tuple[int, ...] = ()
    shared: Tensor | None = None
    cosines: Tensor | None = None


@dataclass
class ZOBroadcast:
    """What the clients receive: the phase, the current global point and the family's shared vector."""

    phase: str
    x: Tensor
    shared: Tensor | None


@dataclass
class ZOReply:
    """One client's upload (the server averages each part) and its per-step cosines if tracked."""

    client: int
    parts: tuple[Tensor, ...]
    cosines: Tensor | None = None


class ZOFamily(Algorithm):
    """Base of the FZooS and FedZO families: objective, plan by phase, averaging, evaluation."""

    Params = ZOParams
    phases: tuple[str, ...] = ("local",)

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        self.objective = objective_for(self.params.objective, ctx)
        if self.params.track_cosine and not isinstance(self.params.objective, SyntheticObjective):
            raise ConfigError("algorithm.track_cosine: needs an objective with known gradients "
                             "(objective.kind quadratic, ackley or levy)")

    @property
    def dim(self) -> int:
        return self.objective.dim

    def init(self) -> ZOState:
        x0 = self.objective.x0.clone()
        return ZOState(x0, self.objective.value(x0))

    def plan(self, state: ZOState, round: int, rng: np.random.Generator) -> Plan:
        phase = self.phases[state.phase]
        clients = (sample_clients(self.ctx.num_clients, self.ctx.clients_per_round, rng) if state.phase == 0
                   else np.asarray(state.clients, dtype=np.int64))
        return Plan(clients, ZOBroadcast(phase, state.x, state.shared), phase)

    def optimizer(self) -> LocalOptimizer:
        """A fresh local optimiser: Adam's state is reset every round."""
        return LocalOptimizer(self.params.optimizer, self.params.lr, self.params.clip_iterates)

    def query(self, client: int, U: Tensor, rng: np.random.Generator) -> Tensor:
        """Noisy values y_i(u) = f_i(u) + N(0, sigma^2) at the rows of U (one query each)."""
        values = self.objective.local(client, U)
        noise = self.params.objective.noise_std
        return values + noise * torch.from_numpy(rng.standard_normal(len(U))) if noise > 0 else values

    def cosine(self, g: Tensor, x: Tensor) -> float:
        """cos(g, grad F(x)) against the true global gradient (Fig. 4)."""
        true_grad = self.objective.grad(x)
        assert true_grad is not None, "track_cosine needs known gradients (checked in __init__)"
        return float(torch.nn.functional.cosine_similarity(g, true_grad, dim=0))

    def cost(self, queries: int, floats: int) -> Cost:
        """Queries as oracle calls; an upload of `floats` float64 numbers (upload_vectors in units of d)."""
        return Cost(oracle_calls=queries, upload_vectors=floats / self.dim, upload_bytes=FLOAT_BYTES * floats)

    def shared_after(self, phase: str, means: list[Tensor], state: ZOState) -> Tensor | None:
        """The family's shared vector after averaging `phase`'s uploads (default: unchanged)."""
        return state.shared

    def aggregate(self, state: ZOState, replies: list[ZOReply], rng: np.random.Generator) -> tuple[ZOState, Cost]:
        """Average the uploads part by part; after "local" the mean iterate is the new global point."""
        if not replies:
            return state, Cost()
        phase = self.phases[state.phase]
        means = [torch.stack([r.parts[k] for r in replies]).mean(0) for k in range(len(replies[0].parts))]
        new = replace(state, phase=(state.phase + 1) % len(self.phases), shared=self.shared_after(phase, means, state))
        if state.phase != 0:
            return new, Cost()
        x, value, cost = means[0], state.value, Cost()
        if self.params.server_accept_if_improves:
            value = self.objective.value(x)
            cost = Cost(oracle_calls=self.ctx.num_clients)
            if state.value <= value:
                x, value = state.x, state.value
        cos = [r.cosines for r in replies if r.cosines is not None]
        return replace(new, x=x, value=value, zo_round=state.zo_round + 1, clients=tuple(r.client for r in replies),
                       cosines=torch.stack(cos).mean(0) if cos else None), cost

    def evaluate(self, state: ZOState, data: EvalData) -> dict[str, float]:
        """F(x) of the true global objective, the gap to F* where known, and the round counter."""
        value = self.objective.value(state.x)
        metrics = {"objective": value, "zo_round": float(state.zo_round)}
        if self.objective.optimum is not None:
            metrics["gap"] = value - self.objective.optimum
        if isinstance(self.objective, AttackObjective):
            metrics["attack_success"] = float(value < 0)
        if state.cosines is not None:
            metrics["grad_cos"] = float(state.cosines.mean())
            metrics.update({f"grad_cos_t{t + 1}": float(c) for t, c in enumerate(state.cosines)})
        return metrics
