"""IterativeSketchingFL (Algorithm 1) and its private form (Algorithm 2), the sketching paper

Round t, all N clients (full participation, as in the paper):
  client   u ← w + R_{t-1}ᵀ Δw̃^{t-1}     (de-sketch last round's broadcast into the local replica)
           K local GD steps u ← u − η_local (∇f_c(u) [+ ξ]),  Δw_c = u_K − u_0
           upload R_t Δw_c                 (b numbers; Cost.upload_vectors = b/d of a model vector)
  server   Δw̃^t = η_global · Σ_c ω_c R_t Δw_c / Σ_c ω_c  (b numbers, broadcast next round)
The same R_t encodes round t's uploads and decodes Δw̃^t (Alg. 1, line 9): it is rebuilt by everyone
from (seed, t) with `raysim.algorithms.sketching.sketch.make_sketch`, never sent. The server keeps an evaluation
replica updated by the same code as the clients' (not counted as communication), so its model
after round T is w^{T+1}. With `dp:` each local gradient is the mean of per-example gradients
clipped to C plus fresh N(0, σ²I) noise per (client, round, step), σ from Lemma H.7 (README) with the
Δ₂ of that batch's actual size (under `batch_mean`, 2C/B' for a pass's short last batch of B' < B).
With K = 1 and full-batch gradients the method is sketched GD, w ← w − η_g η_l R_tᵀR_t ∇f(w) (App. E).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.func import functional_call, grad, vmap

from raysim.algorithms.sketching.privacy import accountant_report, clip_per_example, gaussian_sigma, sensitivity
from raysim.algorithms.sketching.sketch import Kind, Sketch, check_sketch, make_sketch
from raysim.contract import ClientData, Cost, EvalData, Plan
from raysim.core.keys import Keys
from raysim.core.rng import torch_stream
from raysim.errors import ConfigError
from raysim.models import initial_vector
from raysim.plugins import register_algorithm
from raysim.training import LocalSGD, LossKind, WeightedDelta, batch_plans, in_fixed_calls, sample_losses


class DPParams(BaseModel):
    """Algorithm 2's privacy: per-step (ε̂, δ̂), per-example clipping at C, and the accountant's δ'."""

    model_config = ConfigDict(extra="forbid")

    epsilon: float = Field(gt=0, description="per-step ε̂ of the Gaussian mechanism")
    delta: float = Field(1e-5, gt=0, lt=1, description="per-step δ̂")
    clip: float = Field(1.0, gt=0, description="per-example gradient clipping norm C (= ℓ_c)")
    sensitivity: Literal["replace_one", "batch_mean"] = Field(
        "replace_one", description="Δ₂ = 2C (any batch size) or 2C/B' (batch mean, replace-one; B' the batch's own size)")
    accountant_delta: float = Field(1e-5, gt=0, lt=1, description="δ' of the rigorous advanced composition")
    strict: bool = Field(True, description="require ε̂ < min(1, 1/√K) (Lemmas H.7, H.9)")


class SketchingParams(BaseModel):
    """Hyperparameters of IterativeSketchingFL; defaults are the paper's (full-batch GD, uniform weights, η_global = 1)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.1, gt=0, description="η_local")
    local_steps: int = Field(1, ge=1, description="K local GD steps per round")
    server_lr: float = Field(1.0, gt=0, description="η_global")
    batch_size: int | None = Field(None, ge=1, description="None: full local gradient (Algorithm 1)")
    weighting: Literal["uniform", "samples"] = "uniform"
    loss: LossKind = Field("ce", description="FedAvg's losses: ce, bce (soft-label logistic), mse")
    l2: float = Field(0.0, ge=0, description="per-sample regularizer (l2/2)‖θ‖² (data-independent: never clipped)")
    sketch: Kind = "countsketch"
    b_sketch: int | None = Field(None, ge=1, description="sketch size b; None: b = d (the model's size)")
    nnz_per_col: int = Field(1, ge=1, description="nonzeros per column of the sparse embeddings")
    dp: DPParams | None = None

    @model_validator(mode="after")
    def _valid_epsilon(self):
        if self.dp is not None and self.dp.strict and self.dp.epsilon >= min(1.0, 1.0 / math.sqrt(self.local_steps)):
            raise ValueError(f"dp.epsilon: {self.dp.epsilon} must be < min(1, 1/sqrt(local_steps)) ="
                             f" {min(1.0, 1.0 / math.sqrt(self.local_steps)):.4g} for Lemma H.7/H.9's guarantee;"
                             " set dp.strict: false to run outside it (the RDP/exact accountants stay valid)")
        return self


@dataclass
class ServerState:
    """The evaluation replica w (after applying Δw̃^round), and the b numbers Δw̃^round to broadcast."""

    params: np.ndarray
    delta: np.ndarray | None
    round: int


@dataclass
class Broadcast:
    """Round `round`'s message: Δw̃ (b numbers) and the round whose R decodes it; no matrix travels."""

    round: int
    delta: np.ndarray | None
    delta_round: int


@dataclass
class Replica:
    """A client's copy of the global model and the last round whose broadcast it applied (0: w^0)."""

    params: np.ndarray
    round: int


@register_algorithm("sketching")
class IterativeSketchingFL(LocalSGD):
    """Algorithm 1/2 on a torch classifier; the model, loss and evaluation are FedAvg's."""

    supports_privacy = False  # it has its own DP (`dp:`)

    Params = SketchingParams
    reducible = True

    def __init__(self, ctx):
        super().__init__(ctx)
        p = self.params
        self.d = self.spec.size
        self.b = self.d if p.b_sketch is None else p.b_sketch
        try:
            check_sketch(p.sketch, self.b, self.d, p.nnz_per_col)
        except ValueError as e:
            raise ConfigError(f"algorithm.{e}") from None
        if ctx.clients_per_round != ctx.num_clients:
            raise ConfigError(f"algorithm.clients_per_round: IterativeSketchingFL is full participation (Algorithm 1: every client keeps the replica every round);"
                             f" set it to data.num_clients={ctx.num_clients} (got {ctx.clients_per_round})")
        self.sigma = 0.0
        if p.dp is not None:  # σ/Δ₂ is fixed by (ε̂, δ̂); Δ₂ (so σ) is each batch's own, see step_many
            self.noise_multiplier = gaussian_sigma(p.dp.epsilon, p.dp.delta, 1.0)
            self.sigma = self.noise_multiplier * float(sensitivity(p.dp.clip, self.batch_width, p.dp.sensitivity))
            self._pex = vmap(vmap(grad(self._example_loss), in_dims=(None, 0, 0)))
        self._sketches: dict[int, Sketch] = {}

    def _example_loss(self, params: dict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return sample_losses(functional_call(self.module, params, (x[None],)), y[None], self.params.loss)[0]

    def sketch(self, round: int) -> Sketch:
        """R_round, rebuilt from (seed, round); a memo of the last two (a pure function, so safe to cache)."""
        if round not in self._sketches:
            p = self.params
            self._sketches = {r: s for r, s in self._sketches.items() if r >= round - 1}
            self._sketches[round] = make_sketch(p.sketch, self.b, self.d, self.ctx.seed, round, p.nnz_per_col,
                                                self.dtype, self.device)
        return self._sketches[round]

    def apply_broadcast(self, params: np.ndarray, delta: np.ndarray, delta_round: int) -> np.ndarray:
        """w + R_{delta_round}ᵀ Δw̃: the de-sketch every replica (clients and server) applies identically."""
        w = torch.as_tensor(params, device=self.device)
        return (w + self.sketch(delta_round).desk(torch.as_tensor(delta, device=self.device))).cpu().numpy()

    def _w0(self) -> np.ndarray:
        """w^0, drawn by every party from the same seed (Alg. 1 line 2)."""
        c = self.ctx
        return initial_vector(c.model, c.feature_shape, c.image_shape, c.num_classes, c.seed)

    def init(self) -> ServerState:
        return ServerState(self._w0(), None, 0)

    def client_init(self, client: int) -> Replica:
        return Replica(self._w0(), 0)

    def plan(self, state: ServerState, round: int, rng: np.random.Generator) -> Plan:
        if round != state.round + 1:
            raise ValueError(f"IterativeSketchingFL runs rounds 1, 2, ... in order (round {round} after {state.round})")
        return Plan(np.arange(self.ctx.num_clients), Broadcast(round, state.delta, state.round))

    def _advance(self, replica: Replica, bc: Broadcast) -> Replica:
        """The replica after applying the broadcast; a replica that missed a round cannot be repaired."""
        if bc.delta is None:
            return replica
        if replica.round != bc.delta_round - 1:
            raise RuntimeError(f"client replica is at round {replica.round} but the broadcast decodes round "
                               f"{bc.delta_round}: IterativeSketchingFL needs every client in every round")
        return Replica(self.apply_broadcast(replica.params, bc.delta, bc.delta_round), bc.delta_round)

    def step(self, cstate: Replica, data: ClientData, broadcast: Broadcast, rng: np.random.Generator):
        return self.step_many([cstate], [data], broadcast, [rng])[0]

    def _grads(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Per-client minibatch mean gradients [k, d]; under DP the mean of per-example gradients clipped to C."""
        if self.params.dp is None:
            return self.batch_grads(theta, x, y, w)
        per = in_fixed_calls(self._per_example, self._vgrad.width, theta, x, y)  # [k, B, d]
        per = clip_per_example(per, self.params.dp.clip)
        return (w[..., None] * per).sum(1) / w.sum(1).clamp_min(1.0)[:, None] + self.params.l2 * theta

    def _per_example(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-example gradients [k, B, d] of one call's clients (a fixed number of them: a client's bits do not
        depend on which clients share its shard)."""
        return self.spec.flatten(self._pex(self.spec.unflatten(theta), x, y))

    def step_many(self, cstates: list, datas: list[ClientData], broadcast: Broadcast, rngs: list):
        """K local steps of all the shard's clients at once (they share the replica), then R_t of each update."""
        p, t, k = self.params, broadcast.round, len(datas)
        replica = self._advance(cstates[0], broadcast)
        for c in cstates[1:]:
            if c.round != cstates[0].round or not np.array_equal(c.params, cstates[0].params):
                raise RuntimeError("client replicas differ: IterativeSketchingFL needs every client in every round")
        plans = batch_plans(np.array([len(d) for d in datas]), p.batch_size, p.local_steps, None, Keys.of(rngs),
                            self.batch_width)
        nmax = max(len(d) for d in datas)
        on = {"device": self.device}
        x = torch.zeros((k, nmax, *datas[0].x.shape[1:]), dtype=self.dtype, **on)
        y = torch.zeros((k, nmax, *datas[0].y.shape[1:]), dtype=datas[0].y.dtype, **on)
        idx = torch.from_numpy(plans.idx).to(self.device)
        w = torch.from_numpy(plans.w).to(self.device, self.dtype)
        for i, d in enumerate(datas):
            x[i, : len(d)], y[i, : len(d)] = d.x, d.y
        if p.dp is not None:  # fresh per (client, round, step), keyed (seed, round, client, "dp")
            sizes = plans.w.sum(2)  # [k, K]: a pass's last batch may be short
            delta2 = sensitivity(p.dp.clip, sizes, p.dp.sensitivity)
            sigma = torch.as_tensor(self.noise_multiplier * delta2, dtype=self.dtype)
            noise = (sigma[..., None] * torch.stack([
                torch.randn((p.local_steps, self.d), generator=torch_stream(self.ctx.seed, t, d.client_id, "dp"),
                            dtype=self.dtype) for d in datas])).to(self.device)
        theta_g = torch.as_tensor(replica.params, device=self.device)
        theta = theta_g.expand(k, -1).clone()
        rows = torch.arange(k, device=self.device)[:, None]
        every = torch.ones((k, 1), dtype=self.dtype, device=self.device)
        for s in range(p.local_steps):
            g = self._grads(theta, x[rows, idx[:, s]], y[rows, idx[:, s]], w[:, s])
            if p.dp is not None:
                g = g + noise[:, s]
            theta.addcmul_(every, g, value=-p.lr)  # FedAvg's step_many arithmetic (fused), so `none` == FedAvg bitwise
        weights = [float(len(d)) if p.weighting == "samples" else 1.0 for d in datas]
        scaled = torch.tensor(weights, dtype=self.dtype, device=self.device)[:, None] * (theta - theta_g)
        uploads = self.sketch(t).sk(scaled).cpu().numpy()
        nbytes = self.b * uploads.itemsize
        return [(WeightedDelta(uploads[i], weights[i]), replica,
                 Cost(oracle_calls=int(plans.w[i].sum()), oracle_batches=p.local_steps, upload_vectors=self.b / self.d,
                      upload_bytes=nbytes))
                for i in range(k)]

    def aggregate(self, state: ServerState, replies: list[WeightedDelta], rng) -> tuple[ServerState, Cost]:
        """Δw̃^t = η_global · weighted mean of the sketches; the evaluation replica applies R_tᵀ Δw̃^t."""
        if not replies:
            raise RuntimeError("IterativeSketchingFL got no uploads: the server never aggregates a partial round")
        t = state.round + 1
        total = self.reduce(replies)
        delta = self.params.server_lr * total.total / total.weight
        return ServerState(self.apply_broadcast(state.params, delta, t), delta, t), Cost()

    def evaluate(self, state: ServerState, data: EvalData) -> dict[str, float]:
        """FedAvg's metrics of the replica, the sketch size, and under DP σ (of the largest batch) and the accountants
        after t·K steps (σ/Δ₂ is the same for every batch, so they hold for short batches too)."""
        metrics = {**super().evaluate(state, data), "sketch_b": float(self.b)}
        dp = self.params.dp
        if dp is not None:
            metrics["dp_sigma"] = self.sigma
            metrics.update(accountant_report(dp.epsilon, dp.delta, self.noise_multiplier,
                                             state.round * self.params.local_steps, dp.accountant_delta))
        return metrics
