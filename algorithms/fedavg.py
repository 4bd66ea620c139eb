"""FedAvg in the FedPAQ form (specs/fedlrgd.md §4.1) and FedProx, for torch classifiers.

A round: the server samples clients and broadcasts θ; each client runs local SGD steps
θ ← θ − lr·(∇f_c(θ) + μ(θ − θ_g)) (μ = 0 is FedAvg) and uploads its weighted delta; the server
applies θ ← θ + server_lr · Σ w_c Δ_c / Σ w_c. A shard runs its clients at once with
`torch.func.vmap` over stacked parameter vectors; `step` is the per-client reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.func import functional_call, grad, vmap

from raysim.contract import Algorithm, ClientData, Cost, EvalData, Plan
from raysim.models import DTYPES, ParamSpec, build_model, initial_vector
from raysim.registry import register_algorithm
from raysim.sampling import sample_clients


class FedAvgParams(BaseModel):
    """Hyperparameters of FedAvg/FedPAQ: local SGD steps (or epochs) of a minibatch size."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.05, gt=0)
    local_steps: int | None = Field(None, ge=1)
    local_epochs: int | None = Field(None, ge=1)
    batch_size: int | None = Field(10, ge=1, description="None: full local batch")
    server_lr: float = Field(1.0, gt=0)
    weighting: Literal["samples", "uniform"] = "samples"

    @model_validator(mode="after")
    def _one_length(self):
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("set either local_steps or local_epochs, not both")
        if self.local_steps is None and self.local_epochs is None:
            self.local_steps = 10
        return self


class FedProxParams(FedAvgParams):
    """FedProx adds the proximal weight μ ≥ 0 pulling local iterates towards the broadcast."""

    mu: float = Field(0.01, ge=0)


@dataclass
class ServerState:
    """The global model as one flat parameter vector."""

    params: np.ndarray


@dataclass
class WeightedDelta:
    """A client's upload: weight·(θ_c − θ_g) and the weight; summing two is a valid shard pre-reduction."""

    total: np.ndarray
    weight: float


@dataclass
class BatchPlan:
    """Index and weight of every sample of every local step; weight 0 pads a short batch."""

    idx: np.ndarray  # [steps, batch] int64
    w: np.ndarray  # [steps, batch] 0/1


def batch_plan(n: int, batch_size: int | None, local_steps: int | None, local_epochs: int | None,
               rng: np.random.Generator) -> BatchPlan:
    """Minibatches without replacement within each pass over the data (a fresh permutation per pass)."""
    b = n if batch_size is None else min(batch_size, n)
    per_epoch = math.ceil(n / b)
    steps = local_steps if local_steps is not None else local_epochs * per_epoch
    idx = np.zeros((steps, b), dtype=np.int64)
    w = np.zeros((steps, b))
    for s in range(steps):
        e, j = divmod(s, per_epoch)
        if j == 0:
            perm = rng.permutation(n)
        chunk = perm[j * b : (j + 1) * b]
        idx[s, : len(chunk)] = chunk
        w[s, : len(chunk)] = 1.0
    return BatchPlan(idx, w)


@register_algorithm("fedavg")
class FedAvg(Algorithm):
    """FedAvg/FedPAQ with partial participation, b local SGD steps and a server learning rate."""

    Params = FedAvgParams
    reducible = True
    mu = 0.0

    def __init__(self, ctx):
        super().__init__(ctx)
        self.module = build_model(ctx.model, ctx.feature_shape, ctx.image_shape, ctx.num_classes)
        self.spec = ParamSpec.of(self.module)
        self.dtype = DTYPES[ctx.model.dtype]
        self.device = torch.device(ctx.device)
        self.module.to(self.device)
        self._grad = grad(self._loss)
        self._vgrad = vmap(self._grad)

    def _loss(self, params: dict, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        ce = F.cross_entropy(functional_call(self.module, params, (x,)), y, reduction="none")
        return (w * ce).sum() / w.sum().clamp_min(1.0)

    def init(self) -> ServerState:
        return ServerState(initial_vector(self.ctx.model, self.ctx.feature_shape, self.ctx.image_shape,
                                          self.ctx.num_classes, self.ctx.seed))

    def plan(self, state: ServerState, round: int, rng: np.random.Generator) -> Plan:
        return Plan(sample_clients(self.ctx.num_clients, self.ctx.clients_per_round, rng), state.params)

    def _plan_for(self, data: ClientData, rng: np.random.Generator) -> BatchPlan:
        p = self.params
        return batch_plan(len(data), p.batch_size, p.local_steps, p.local_epochs, rng)

    def _reply(self, theta: torch.Tensor, theta_g: torch.Tensor, data: ClientData, bp: BatchPlan) -> tuple:
        weight = float(len(data)) if self.params.weighting == "samples" else 1.0
        delta = (theta - theta_g).cpu().numpy()
        cost = Cost(oracle_calls=int(bp.w.sum()), oracle_batches=len(bp.w), upload_vectors=1.0,
                    upload_bytes=delta.nbytes)
        return WeightedDelta(weight * delta, weight), None, cost

    def step(self, cstate, data: ClientData, broadcast: np.ndarray, rng: np.random.Generator):
        """The per-client reference: local SGD on one client, one step at a time."""
        theta_g = torch.tensor(broadcast, dtype=self.dtype, device=self.device)
        theta = theta_g.clone()
        bp = self._plan_for(data, rng)
        idx = torch.from_numpy(bp.idx).to(self.device)
        w = torch.from_numpy(bp.w).to(self.device, self.dtype)
        for s in range(len(bp.idx)):
            g = self.spec.flatten(self._grad(self.spec.unflatten(theta), data.x[idx[s]], data.y[idx[s]], w[s]))
            theta = theta - self.params.lr * (g + self.mu * (theta - theta_g))
        return self._reply(theta, theta_g, data, bp)

    def step_many(self, cstates: list, datas: list[ClientData], broadcast: np.ndarray, rngs: list):
        """All clients of a shard at once: stacked parameters, vmap of the per-sample-batch gradient."""
        if len(datas) <= 1:
            return super().step_many(cstates, datas, broadcast, rngs)
        k = len(datas)
        plans = [self._plan_for(d, r) for d, r in zip(datas, rngs)]
        steps = max(len(p.idx) for p in plans)
        bsz = max(p.idx.shape[1] for p in plans)
        nmax = max(len(d) for d in datas)
        on = {"device": self.device}
        x = torch.zeros((k, nmax, *datas[0].x.shape[1:]), dtype=self.dtype, **on)
        y = torch.zeros((k, nmax), dtype=torch.int64, **on)
        idx = torch.zeros((k, steps, bsz), dtype=torch.int64, **on)
        w = torch.zeros((k, steps, bsz), dtype=self.dtype, **on)
        active = torch.zeros((k, steps, 1), dtype=self.dtype, **on)
        for i, (d, p) in enumerate(zip(datas, plans)):
            x[i, : len(d)] = d.x
            y[i, : len(d)] = d.y
            s, b = p.idx.shape
            idx[i, :s, :b] = torch.from_numpy(p.idx)
            w[i, :s, :b] = torch.from_numpy(p.w)
            active[i, :s] = 1.0
        theta_g = torch.tensor(broadcast, dtype=self.dtype, device=self.device)
        theta = theta_g.expand(k, -1).clone()
        rows = torch.arange(k, device=self.device)[:, None]
        for s in range(steps):
            xb, yb = x[rows, idx[:, s]], y[rows, idx[:, s]]
            g = self.spec.flatten(self._vgrad(self.spec.unflatten(theta), xb, yb, w[:, s]))
            theta = theta - active[:, s] * self.params.lr * (g + self.mu * (theta - theta_g))
        return [self._reply(theta[i], theta_g, d, p) for i, (d, p) in enumerate(zip(datas, plans))]

    def reduce(self, replies: list[WeightedDelta]) -> WeightedDelta:
        return WeightedDelta(np.sum([r.total for r in replies], axis=0), sum(r.weight for r in replies))

    def aggregate(self, state: ServerState, replies: list[WeightedDelta], rng) -> tuple[ServerState, Cost]:
        if not replies:
            return state, Cost()
        total = self.reduce(replies)
        return ServerState(state.params + self.params.server_lr * total.total / total.weight), Cost()

    def evaluate(self, state: ServerState, data: EvalData) -> dict[str, float]:
        """Test accuracy and loss, and the loss on (a capped sample of) the pooled training data."""
        params = self.spec.unflatten(torch.tensor(state.params, dtype=self.dtype, device=self.device))
        with torch.no_grad():
            logits = functional_call(self.module, params, (data.test_x,))
            train_logits = functional_call(self.module, params, (data.train_x,))
        return {
            "test_accuracy": float((logits.argmax(1) == data.test_y).double().mean()),
            "test_loss": float(F.cross_entropy(logits, data.test_y)),
            "train_loss": float(F.cross_entropy(train_logits, data.train_y)),
        }


@register_algorithm("fedprox")
class FedProx(FedAvg):
    """FedProx: FedAvg whose local objective adds (μ/2)‖θ − θ_g‖²."""

    Params = FedProxParams

    def __init__(self, ctx):
        super().__init__(ctx)
        self.mu = self.params.mu
