"""Local SGD on torch models, the training loop every model-training family shares: FedAvg in the
FedPAQ form (the FedLRGD paper), which families register under their own names and extend.

A round k: the server samples clients and broadcasts θ_k and the round's step size η_k; each
client runs local SGD steps θ ← θ − η_k·(∇f_c(θ) + μ(θ − θ_g)) (μ = 0 is FedAvg) and uploads its
weighted delta Q(θ_c − θ_k) (Q the identity, or FedPAQ's unbiased QSGD quantizer); the server
applies θ ← θ + server_lr · Σ w_c Q(Δ_c) / Σ w_c. The loss is cross-entropy (class labels or soft
class distributions), the soft-label logistic loss (66) of a scalar output, or squared error, plus
(l2/2)‖θ‖² per sample. η_k is constant or FedPAQ's decaying 4/(μ((k + T0) b + 1)) (spec §8.8).
A shard runs its clients at once over stacked parameter vectors (raysim.training.stacked's batched matmuls for
chains of linear layers, `torch.func.vmap` for other models); `step` is the per-client reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.func import functional_call, grad, vmap
from torch.nn.utils.rnn import pad_sequence

from raysim.contract import Algorithm, ClientData, Cost, EvalData, Plan
from raysim.models import initial_vector, placed_model
from raysim.training.local_optim import LocalOptimizer
from raysim.training.sampling import sample_clients
from raysim.training.stacked import stacked_grad


LossKind = Literal["ce", "bce", "mse"]


def sample_losses(out: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-sample losses of outputs `out` (B, k): `ce` cross-entropy with class labels or soft class
    distributions; `bce` the soft-label logistic loss (66) y·log(1+e^{−z}) + (1−y)·log(1+e^{z}) of a
    scalar output z; `mse` ½‖out − y‖² (integer labels as one-hot)."""
    if y.is_floating_point():
        y = y.to(out.dtype)
    if kind == "ce":
        return F.cross_entropy(out, y, reduction="none")
    if kind == "bce":
        return F.binary_cross_entropy_with_logits(out.reshape(y.shape), y, reduction="none")
    target = y.reshape(out.shape) if y.is_floating_point() else F.one_hot(y, out.shape[-1]).to(out.dtype)
    return 0.5 * ((out - target) ** 2).reshape(len(out), -1).sum(1)


EVAL_CHUNK_ROWS = 1 << 15  # logits a chunk at a time: its temporaries stay in cache


def class_metrics(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-sample cross-entropy, predicted class) of logits `out` (B, k) and class labels `y`, from one
    max over the classes: log Σ exp(z − m) + m − z_y. Four times faster than `F.cross_entropy` on a
    few classes (its log-softmax writes all B·k values), equal to it within float rounding."""
    losses = out.new_empty(len(out))
    pred = torch.empty(len(out), dtype=torch.long, device=out.device)
    for a in range(0, len(out), EVAL_CHUNK_ROWS):
        z, b = out[a:a + EVAL_CHUNK_ROWS], a + EVAL_CHUNK_ROWS
        top, pred[a:b] = z.max(1)  # the first maximal class, as argmax
        losses[a:b] = (z - top[:, None]).exp_().sum(1).log_().add_(top).sub_(z.gather(1, y[a:b, None]).squeeze(1))
    return losses, pred


def squared_norm(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """‖θ‖² of named parameters."""
    return cast(torch.Tensor, sum((p * p).sum() for p in params.values()))  # never empty: not sum's start 0


def qsgd(v: np.ndarray, levels: int, rng: np.random.Generator) -> np.ndarray:
    """QSGD's unbiased stochastic quantizer with `levels` = s levels (FedPAQ, spec §4.1):
    Q(v)_i = ‖v‖ sign(v_i) ξ_i, ξ_i = (l+1)/s with probability s|v_i|/‖v‖ − l, else l/s, l = ⌊s|v_i|/‖v‖⌋."""
    norm = float(np.linalg.norm(v))
    if norm == 0.0:
        return np.zeros_like(v)
    scaled = np.abs(v) * (levels / norm)
    low = np.floor(scaled)
    xi = (low + (rng.random(v.shape) < scaled - low)) / levels
    return (norm * np.sign(v) * xi).astype(v.dtype)


def qsgd_bytes(p: int, levels: int) -> int:
    """Bytes of one QSGD-encoded p-vector: a float32 norm, then per coordinate a sign bit and a level index."""
    return math.ceil((32 + p * (1 + math.ceil(math.log2(levels + 1)))) / 8)


class LocalSGDParams(BaseModel):
    """Hyperparameters of FedAvg/FedPAQ: local SGD steps (or epochs) of a minibatch size, the loss,
    the step-size schedule and the upload quantizer."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.05, gt=0, description="the constant step size (lr_schedule: constant)")
    local_steps: int | None = Field(None, ge=1)
    local_epochs: int | None = Field(None, ge=1)
    batch_size: int | None = Field(10, ge=1, description="None: full local batch")
    server_lr: float = Field(1.0, gt=0)
    weighting: Literal["samples", "uniform"] = "samples"
    theta0: Literal["model_init", "zeros"] = Field("model_init", description="the initial global model")
    loss: LossKind = Field("ce", description="ce (labels or soft classes), bce (soft-label logistic (66)), mse")
    l2: float = Field(0.0, ge=0, description="per-sample regularizer (l2/2)‖θ‖²")
    lr_schedule: Literal["constant", "fedpaq", "fedpaq_capped"] = Field(
        "constant", description="constant lr; fedpaq 4/(μ((k+T0)b+1)); fedpaq_capped min(1/L1, 4/(μ(kb+1))) (§8.8)")
    strong_convexity: float | None = Field(None, gt=0, description="μ of the fedpaq schedules; None: l2")
    L1: float | None = Field(None, gt=0, description="smoothness of the fedpaq schedules (T0 = 4κ, the cap 1/L1)")
    t0: float | None = Field(None, ge=0, description="shift T0 of the fedpaq schedule; None: 4κ = 4 L1/μ")
    local_optimizer: LocalOptimizer = Field(default_factory=LocalOptimizer,
                                            description="{kind: sgd | adam, momentum, weight_decay, betas, eps}")
    quantizer: Literal["none", "qsgd"] = Field("none", description="upload Q(Δ): identity or unbiased QSGD")
    levels: int = Field(1, ge=1, description="QSGD levels s")

    @model_validator(mode="after")
    def _one_length(self):
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("set either local_steps or local_epochs, not both")
        if self.local_steps is None and self.local_epochs is None:
            self.local_steps = 10
        if self.lr_schedule != "constant":
            if self.local_steps is None:
                raise ValueError(f"lr_schedule {self.lr_schedule!r} needs local_steps (b), not local_epochs")
            if self.strong_convexity is None and self.l2 == 0:
                raise ValueError(f"lr_schedule {self.lr_schedule!r} needs strong_convexity (or l2 > 0) for μ")
            if self.L1 is None and (self.lr_schedule == "fedpaq_capped" or self.t0 is None):
                raise ValueError(f"lr_schedule {self.lr_schedule!r} needs L1" +
                                 (" (or t0)" if self.lr_schedule == "fedpaq" else ""))
        return self

    def step_size(self, k: int) -> float:
        """η_k of round k = 0, 1, ... (FedPAQ's schedule is constant within a round)."""
        if self.lr_schedule == "constant":
            return self.lr
        mu, b = self.strong_convexity or self.l2, self.local_steps
        assert b is not None  # _one_length: a schedule needs local_steps
        if self.lr_schedule == "fedpaq":
            if self.t0 is not None:
                t0 = self.t0
            else:
                assert self.L1 is not None  # _one_length: fedpaq needs L1 or t0
                t0 = 4.0 * self.L1 / mu
            return 4.0 / (mu * ((k + t0) * b + 1))
        assert self.L1 is not None  # _one_length: fedpaq_capped needs L1
        return min(1.0 / self.L1, 4.0 / (mu * (k * b + 1)))


@dataclass
class ServerState:
    """The global model as one flat parameter vector."""

    params: np.ndarray


@dataclass
class Broadcast:
    """What the server sends a round: θ_k and the round's step size η_k."""

    params: np.ndarray
    lr: float


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
    if local_steps is not None:
        steps = local_steps
    else:
        assert local_epochs is not None, "batch_plan needs local_steps or local_epochs"
        steps = local_epochs * per_epoch
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


class LocalSGD(Algorithm):
    """FedAvg/FedPAQ with partial participation, b local SGD steps and a server learning rate (unregistered:
    the fedavg family registers it as `fedavg`; other families subclass it). Its state, broadcast and reply
    types are the ones below, but the hooks take the contract's Any: subclasses (SCAFFOLD, sketching, server
    optimizers) bring their own."""

    Params: ClassVar[type[BaseModel] | None] = LocalSGDParams
    reducible = True
    mu = 0.0

    def __init__(self, ctx):
        super().__init__(ctx)
        self.module, self.spec, self.dtype, self.device = placed_model(ctx)
        largest = int(np.max(ctx.client_sizes))
        self.batch_width = largest if self.params.batch_size is None else min(self.params.batch_size, largest)
        self._grad = grad(self._loss)
        self._vgrad = vmap(self._grad)
        self._stacked = stacked_grad(self.module, tuple(ctx.feature_shape), self.spec, self.params.loss,
                                     lambda out, y: sample_losses(out, y, self.params.loss), self.params.l2)

    def _loss(self, params: dict, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        losses = sample_losses(functional_call(self.module, params, (x,)), y, self.params.loss)
        reg = 0.5 * self.params.l2 * squared_norm(params) if self.params.l2 else 0.0
        return (w * losses).sum() / w.sum().clamp_min(1.0) + reg

    def batch_grads(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Every client's minibatch gradient of `_loss` at rows θ [k, d] at once: stacked matmuls where the
        model is a chain of linear layers (raysim.training.stacked: the same bits), else vmap."""
        if self._stacked is not None:
            return self._stacked(theta, x, y, w)
        return self.spec.flatten(self._vgrad(self.spec.unflatten(theta), x, y, w))

    def objective(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """F(θ) = mean per-sample loss + (l2/2)‖θ‖² on (x, y), in θ's dtype (differentiable)."""
        params = self.spec.unflatten(theta)
        out = functional_call(self.module, params, (x.to(theta.dtype),))
        return sample_losses(out, y, self.params.loss).mean() + 0.5 * self.params.l2 * (theta * theta).sum()

    def init(self) -> Any:
        theta = initial_vector(self.ctx.model, self.ctx.feature_shape, self.ctx.image_shape,
                               self.ctx.num_classes, self.ctx.seed)
        return ServerState(np.zeros_like(theta) if self.params.theta0 == "zeros" else theta)

    def plan(self, state: Any, round: int, rng: np.random.Generator) -> Plan:
        clients = sample_clients(self.ctx.num_clients, self.ctx.clients_per_round, rng)
        return Plan(clients, Broadcast(state.params, self.params.step_size(max(round - 1, 0))))

    def _unpack(self, broadcast: Broadcast | np.ndarray) -> tuple[torch.Tensor, float]:
        """(θ_g, η) of a broadcast; a bare parameter vector stands for the constant lr."""
        if isinstance(broadcast, Broadcast):
            theta, lr = broadcast.params, broadcast.lr
        elif self.params.lr_schedule == "constant":
            theta, lr = broadcast, self.params.lr
        else:
            raise ValueError(f"fedavg: lr_schedule {self.params.lr_schedule!r} needs a Broadcast with the round's lr")
        return torch.tensor(theta, dtype=self.dtype, device=self.device), lr

    def _plan_for(self, data: ClientData, rng: np.random.Generator) -> BatchPlan:
        p = self.params
        return batch_plan(len(data), p.batch_size, p.local_steps, p.local_epochs, rng)

    def _reply(self, delta: np.ndarray, data: ClientData, bp: BatchPlan, rng: np.random.Generator) -> tuple:
        """The weighted upload Q(Δ) of a client's Δ = θ_c − θ_g; QSGD draws from the client's rng after its batch plan."""
        p = self.params
        weight = float(len(data)) if p.weighting == "samples" else 1.0
        nbytes = delta.nbytes
        if p.quantizer == "qsgd":
            delta = qsgd(delta, p.levels, rng)
            nbytes = qsgd_bytes(delta.size, p.levels)
        cost = Cost(oracle_calls=int(bp.w.sum()), oracle_batches=len(bp.w), upload_vectors=nbytes / delta.nbytes,
                    upload_bytes=nbytes)
        return WeightedDelta(weight * delta, weight), None, cost

    def step(self, cstate: Any, data: ClientData, broadcast: Any, rng: np.random.Generator) -> tuple[Any, Any, Cost]:
        """The per-client reference: local SGD on one client, one step at a time."""
        theta_g, lr = self._unpack(broadcast)
        theta = theta_g.clone()[None]
        bp = self._plan_for(data, rng)
        idx = torch.from_numpy(bp.idx).to(self.device)
        w = torch.from_numpy(bp.w).to(self.device, self.dtype)
        opt, one = self.params.local_optimizer.start(theta), torch.ones((1, 1), dtype=self.dtype, device=self.device)
        correction = self.correction([cstate], broadcast)
        for s in range(len(bp.idx)):
            g = self.spec.flatten(self._grad(self.spec.unflatten(theta[0]), data.x[idx[s]], data.y[idx[s]], w[s]))
            g = (g + self.mu * (theta[0] - theta_g))[None]
            opt.step(theta, g if correction is None else g + correction, lr, one)
        return self._reply((theta[0] - theta_g).cpu().numpy(), data, bp, rng)

    def correction(self, cstates: list, broadcast) -> torch.Tensor | None:
        """A fixed term [k, d] added to every local gradient of the round's clients (SCAFFOLD's c − c_i); None here."""
        return None

    def _batch_width(self, plans: list[BatchPlan]) -> int:
        """The padded minibatch width of a vectorized step: the batch size, or the largest client's size
        under full batches (`batch_width`). The same in every shard, so a client's sums run over the
        same width (and give the same bits) whichever clients share its shard."""
        return max(self.batch_width, *(p.idx.shape[1] for p in plans))

    def step_many(self, cstates: list[Any], datas: list[ClientData], broadcast: Any,
                  rngs: list[np.random.Generator]) -> list[tuple[Any, Any, Cost]]:
        """All clients of a shard at once: stacked parameters, vmap of the per-sample-batch gradient
        (also for one client, so a client's numbers do not depend on how many share its shard)."""
        if not datas:
            return []
        k = len(datas)
        plans = [self._plan_for(d, r) for d, r in zip(datas, rngs)]
        steps = max(len(p.idx) for p in plans)
        bsz = self._batch_width(plans)
        idx_np = np.zeros((k, steps, bsz), dtype=np.int64)  # numpy: a slice assignment costs ~1 µs, torch's ~5 µs
        w_np = np.zeros((k, steps, bsz))
        for i, p in enumerate(plans):
            s, b = p.idx.shape
            idx_np[i, :s, :b], w_np[i, :s, :b] = p.idx, p.w
        x = pad_sequence([d.x for d in datas], batch_first=True)
        y = pad_sequence([d.y for d in datas], batch_first=True)
        idx = torch.from_numpy(idx_np).to(self.device)
        w = torch.from_numpy(w_np).to(self.device, self.dtype)
        active = (w.sum(2, keepdim=True) > 0).to(self.dtype)  # every real step has at least one sample
        theta_g, lr = self._unpack(broadcast)
        theta = theta_g.expand(k, -1).clone()
        rows = torch.arange(k, device=self.device)[:, None]
        opt = self.params.local_optimizer.start(theta)
        correction = self.correction(cstates, broadcast)
        for s in range(steps):
            g = self.batch_grads(theta, x[rows, idx[:, s]], y[rows, idx[:, s]], w[:, s])
            if self.mu:
                g = g + self.mu * (theta - theta_g)
            if correction is not None:
                g = g + correction
            opt.step(theta, g, lr, active[:, s])  # in place: plain SGD makes no new k x d buffers per step
        deltas = (theta - theta_g).cpu().numpy()
        return [self._reply(delta, d, p, r) for delta, d, p, r in zip(deltas, datas, plans, rngs)]

    def reduce(self, replies: list[Any]) -> Any:
        return WeightedDelta(np.sum([r.total for r in replies], axis=0), sum(r.weight for r in replies))

    def aggregate(self, state: Any, replies: list[Any], rng: np.random.Generator) -> tuple[Any, Cost]:
        if not replies:
            return state, Cost()
        total = self.reduce(replies)
        return ServerState(state.params + self.params.server_lr * total.total / total.weight), Cost()

    def export(self, state: Any) -> nn.Module:
        """The configured model (on the CPU) holding the server's parameters θ."""
        return self.spec.module_with(self.module, state.params, self.dtype)

    def evaluate(self, state: Any, data: EvalData) -> dict[str, float]:
        """Test accuracy (class labels under ce) and loss; the loss and the objective F(θ) (loss +
        (l2/2)‖θ‖²) on (a capped sample of) the pooled training data."""
        theta = torch.tensor(state.params, dtype=self.dtype, device=self.device)
        params = self.spec.unflatten(theta)
        kind = self.params.loss
        with torch.no_grad():
            out = functional_call(self.module, params, (data.test_x,))
            train_loss = float(sample_losses(functional_call(self.module, params, (data.train_x,)), data.train_y, kind).mean())
        m = {}
        if kind == "ce" and not data.test_y.is_floating_point():
            losses, pred = class_metrics(out, data.test_y)
            m["test_accuracy"] = float((pred == data.test_y).double().mean())
        else:
            losses = sample_losses(out, data.test_y, kind)
        m["test_loss"] = float(losses.mean())
        m["train_loss"] = train_loss
        m["train_objective"] = train_loss + 0.5 * self.params.l2 * float((theta.double() ** 2).sum())
        return m
