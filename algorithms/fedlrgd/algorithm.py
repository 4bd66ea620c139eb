"""FedLRGD, Algorithm 1 of the FedLRGD paper, for torch models.

The server holds its own r samples x^(0,1..r) (fresh draws from the problem's law, not copies of
client samples; n = m s + r) and picks r pivot parameters ϑ^(1..r). Per coordinate i,
G^(i)[j, k] = g_i(x^(0,j); ϑ^(k)). Each client fits the weights that express its samples' gradient
rows through the server's rows, V_c[:, i] = (G^(i))^{-T} h_c[:, i] with h_c = Σ_j pgrad(x^(c,j), ϑ),
and uploads V_c one row (a p-vector) per epoch. The server then runs S steps of inexact GD with

    ∇F̂_i(θ) = (1/n) Σ_k g_i(x^(0,k); θ) (1 + Σ_c V_c[k, i]),   n = m s + r,

using only its own r per-sample gradients per step. Epochs (T = r + 2 rounds, τ = 1):

    round 1        "B"  server: G at r pivots on its r samples       r² server calls
    round 2        "A"  clients: V_c (r s calls each), upload row 1   1 vector per client
    rounds 3..r+1  "C"  clients upload rows 2..r of V_c              1 vector per client, no calls
    round r+2      "B"  server: S steps of inexact GD, step 1/L1     r S server calls

Rounds after r + 2 are idle (no clients, no cost). With `upload: sums` clients upload the rows of
h_c instead and the server applies (G^(i))^{-1} itself (an equivalent variant; same estimate by linearity).
Solves are in float64 with a per-coordinate condition-number check (the paper assumes G^(i) invertible): coordinates whose
cond(G^(i)) exceeds `cond_threshold` warn and use the `fallback` solve (pinv / Tikhonov) or raise.

The math lives in small pure functions (`per_sample_grads`, `client_sums`, `solve_weights`,
`gradient_estimate`, `inexact_gd`) that take any per-sample loss `loss(theta, x, y) -> scalar` of a
flat float64 parameter vector, so tests can use the README's synthetic problems directly.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch.func import functional_call, grad, vmap

from raysim.algorithms.fedlrgd.sources import SAMPLERS
from raysim.contract import Algorithm, ClientData, Cost, EvalData, Plan
from raysim.core.rng import SERVER, SETUP, stream
from raysim.models import ParamSpec, build_model, initial_vector
from raysim.plugins import register_algorithm
from raysim.training import LossKind, sample_losses

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
F64 = torch.float64


class IllConditionedWarning(RuntimeWarning):
    """Some G^(i) had a condition number above the threshold; the fallback solve was used there."""


# ----------------------------------------------------------------------------- pure math


def per_sample_grads(loss: Loss, x: torch.Tensor, y: torch.Tensor, thetas: torch.Tensor) -> torch.Tensor:
    """H[j, k, :] = ∇_θ loss(thetas[k], x[j], y[j]), shape (n_x, n_theta, p) (vmap of grad, twice)."""
    g = vmap(grad(loss), in_dims=(0, None, None))  # over parameters
    return vmap(g, in_dims=(None, 0, 0))(thetas, x, y)  # over samples


def client_sums(loss: Loss, x: torch.Tensor, y: torch.Tensor, pivots: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """h_c[k, :] = Σ_j ∇_θ loss(ϑ_k, x_j, y_j), shape (r, p), accumulated over chunks of samples."""
    h = torch.zeros(pivots.shape, dtype=pivots.dtype, device=pivots.device)
    for a in range(0, len(y), chunk):
        h += per_sample_grads(loss, x[a : a + chunk], y[a : a + chunk], pivots).sum(0)
    return h


def condition_numbers(G: torch.Tensor) -> torch.Tensor:
    """cond_2(G^(i)) for every coordinate i of G (r, r, p); inf for a singular (or zero) matrix."""
    sv = torch.linalg.svdvals(G.permute(2, 0, 1).to(F64))
    smin, smax = sv[:, -1], sv[:, 0]
    return torch.where(smin > 0, smax / torch.where(smin > 0, smin, torch.ones_like(smin)),
                       torch.full_like(smax, math.inf))


def solve_weights(G: torch.Tensor, H: torch.Tensor, cond_threshold: float = 1e12,
                  fallback: Literal["lstsq", "tikhonov", "raise"] = "lstsq", rcond: float = 1e-12,
                  tikhonov: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """V (r, p) with V[:, i] = (G^(i))^{-T} H[:, i] (solve on the transpose, float64), and cond (p,).

    Coordinates with cond(G^(i)) > cond_threshold warn (IllConditionedWarning) and use the fallback:
    `lstsq` the pseudo-inverse with relative cutoff `rcond`, `tikhonov` the regularised inverse
    (G Gᵀ + λI)^{-1} G with λ = tikhonov · σ_max(G^(i))², `raise` a LinAlgError.
    H may carry leading batch dims (..., r, p); the same G is applied to each.
    """
    G, H = G.to(F64), H.to(F64)
    r, _, p = G.shape
    A = G.permute(2, 1, 0)  # A[i] = (G^(i))ᵀ, shape (p, r, r)
    b = H.transpose(-1, -2).unsqueeze(-1)  # (..., p, r, 1)
    cond = condition_numbers(G)
    bad = ~(cond <= cond_threshold)
    out = torch.empty_like(b)
    good = ~bad
    if good.any():
        out[..., good, :, :] = torch.linalg.solve(A[good], b[..., good, :, :])
    if bad.any():
        worst = float(cond[bad].max())
        if fallback == "raise":
            raise np.linalg.LinAlgError(f"FedLRGD: {int(bad.sum())} of {p} matrices G^(i) have condition number "
                                        f"above {cond_threshold:g} (worst {worst:.3g})")
        warnings.warn(f"FedLRGD: {int(bad.sum())} of {p} matrices G^(i) have condition number above "
                      f"{cond_threshold:g} (worst {worst:.3g}); using the {fallback} fallback there",
                      IllConditionedWarning, stacklevel=2)
        Ab = A[bad]
        if fallback == "lstsq":
            inv = torch.linalg.pinv(Ab, rtol=rcond)
        elif fallback == "tikhonov":
            Gb = Ab.transpose(-1, -2)  # G^(i)
            smax2 = torch.linalg.matrix_norm(Gb, ord=2) ** 2
            lam = (tikhonov * smax2).clamp_min(torch.finfo(F64).tiny)[:, None, None]
            eye = torch.eye(r, dtype=F64, device=G.device)
            inv = torch.linalg.solve(Gb @ Gb.transpose(-1, -2) + lam * eye, Gb)  # regularised (Gᵀ)^{-1}
        else:
            raise ValueError(f"unknown fallback {fallback!r}")
        out[..., bad, :, :] = inv @ b[..., bad, :, :]
    return out.squeeze(-1).transpose(-1, -2), cond


def gradient_estimate(g0: torch.Tensor, vbar: torch.Tensor, n: int) -> torch.Tensor:
    """∇F̂(θ) = (1/n) Σ_k g0[k] ⊙ (1 + V̄[k]) from the server's per-sample gradients g0 (r, p) at θ (41)."""
    return ((1.0 + vbar) * g0).sum(0) / n


def inexact_gd(loss: Loss, x0: torch.Tensor, y0: torch.Tensor, vbar: torch.Tensor, n: int, theta0: torch.Tensor,
               lr: float, steps: int) -> torch.Tensor:
    """θ^(γ) = θ^(γ-1) − lr · ∇F̂(θ^(γ-1)) for γ = 1..steps (42); r per-sample gradients per step."""
    theta = theta0.to(F64)
    for _ in range(steps):
        g0 = per_sample_grads(loss, x0, y0, theta[None])[:, 0]
        theta = theta - lr * gradient_estimate(g0, vbar, n)
    return theta


# ----------------------------------------------------------------------------- the algorithm


class FedLRGDParams(BaseModel):
    """Hyperparameters of FedLRGD (rank r, GD steps S, step 1/L1) and of its numerical choices."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(4, ge=1, description="approximate rank = server samples = pivot parameters")
    S: int = Field(20, ge=0, description="inexact GD iterations in the last epoch")
    L1: float | None = Field(None, gt=0, description="smoothness; None: the logreg/linear bound for features in [0,1]")
    loss: LossKind = Field("ce", description="ce (labels or soft classes), bce (soft-label logistic (66)), mse")
    mu: float = Field(0.0, ge=0, description="ℓ2 weight: f = loss + mu/2 ‖θ‖² per sample")
    theta0: Literal["model_init", "zeros"] = "model_init"
    pivot_dist: Literal["normal", "uniform"] = "normal"
    pivot_center: Literal["theta0", "zeros"] = "theta0"
    pivot_scale: float = Field(1.0, gt=0, description="σ of the normal, half-width of the uniform box")
    upload: Literal["weights", "sums"] = Field("weights", description="rows of V_c, or of h_c (server inverts)")
    cond_threshold: float = Field(1e12, gt=0)
    fallback: Literal["lstsq", "tikhonov", "raise"] = "lstsq"
    rcond: float = Field(1e-12, gt=0)
    tikhonov: float = Field(1e-12, gt=0)
    chunk_size: int = Field(256, ge=1)
    server_source: str | None = Field(
        None, description="the smooth source (= data.source) whose law the server draws its own r samples "
                          "from; None: the constructor's server_data")


@dataclass
class FedLRGDState:
    """Server state: θ, the pivots, G, the summed uploaded rows (of V_c or h_c) and the epoch done."""

    params: np.ndarray
    epoch: int = 0
    pivots: np.ndarray | None = None  # (r, p)
    G: np.ndarray | None = None  # (r, r, p)
    acc: np.ndarray | None = None  # (r, p): Σ_c rows uploaded so far
    cond_max: float = float("nan")  # worst finite cond(G^(i))
    singular_coords: int = 0  # coordinates whose G^(i) is exactly singular (e.g. a feature that is always 0)
    fallback_coords: int = 0


@dataclass
class ClientState:
    """What a client keeps between epochs: its r x p matrix (V_c, or h_c under `upload: sums`)."""

    rows: np.ndarray


@dataclass
class RowUpload:
    """One uploaded row: its index k (0-based) and the p-vector; summing replies is a valid reduction."""

    row: int
    values: np.ndarray


def phase_of(epoch: int, r: int) -> str:
    """The paper's epoch type of 1-based epoch t: B, A, C x (r-1), B, then idle."""
    if epoch == 1 or epoch == r + 2:
        return "B"
    if epoch == 2:
        return "A"
    if 3 <= epoch <= r + 1:
        return "C"
    return "idle"


@register_algorithm("fedlrgd")
class FedLRGD(Algorithm):
    """FedLRGD (Algorithm 1); `server_data=(x, y)` supplies the server's samples (first r are used)."""

    Params = FedLRGDParams
    reducible = True

    def __init__(self, ctx, server_data: tuple | None = None):
        super().__init__(ctx)
        p = self.params
        self.module = build_model(ctx.model, ctx.feature_shape, ctx.image_shape, ctx.num_classes).to(F64)
        self.spec = ParamSpec.of(self.module)
        self.device = torch.device(ctx.device)
        self.module.to(self.device)
        self.n = int(np.sum(ctx.client_sizes)) + p.r
        self.lr = 1.0 / (p.L1 if p.L1 is not None else self._default_L1())
        self.x0, self.y0 = self._server_samples(server_data)

    @classmethod
    def config_problems(cls, params: FedLRGDParams, cfg) -> list[str]:
        """r + 2 rounds at least (Algorithm 1: B, A, C x (r - 1), B), and a law for the server's own samples."""
        problems = []
        if cfg.algorithm.rounds < params.r + 2:
            problems.append(f"algorithm.rounds: FedLRGD needs at least r + 2 = {params.r + 2} rounds"
                            f" (got {cfg.algorithm.rounds}; r = {params.r})")
        if params.server_source != cfg.data.source:
            problems.append(f"algorithm.server_source: the server draws its own r samples from the clients' law, "
                            f"so set it to data.source ({cfg.data.source!r}, got {params.server_source!r})")
        elif params.server_source not in SAMPLERS:
            problems.append(f"algorithm.server_source: the server can draw samples only from "
                            f"{', '.join(sorted(SAMPLERS))}, not {params.server_source!r}")
        return problems

    # ---- setup

    def _default_L1(self) -> float:
        """Bound on L1 for `logreg` / `linear` with features in [0, 1] (as App. A's (68)): c·max‖x'‖² + mu with
        c = ½ (ce), ¼ (bce), 1 (mse), x' = (x, 1) with logreg's bias."""
        if self.ctx.model.name not in ("logreg", "linear"):
            raise ValueError("fedlrgd: set L1 (the smoothness constant) for models other than logreg and linear")
        sq = math.prod(self.ctx.feature_shape) + (self.ctx.model.name == "logreg")  # max ‖x'‖² on [0, 1]^d
        return {"ce": 0.5, "bce": 0.25, "mse": 1.0}[self.params.loss] * sq + self.params.mu

    def _server_samples(self, given: tuple | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The server's own r samples x^(0,1..r) (Sec. I-A): `given`, else r fresh draws from the law of
        `server_source` on a stream of their own, so they are never copies of the clients' samples."""
        r = self.params.r
        if given is not None:
            x, y = given
        elif self.params.server_source in SAMPLERS:
            rng = stream(self.ctx.data_seed, SETUP, SERVER, "fedlrgd_server_samples")
            x, y = SAMPLERS[self.params.server_source](rng, r, math.prod(self.ctx.feature_shape))
        else:
            raise ValueError(f"fedlrgd: no server data; set server_source to one of {', '.join(sorted(SAMPLERS))} "
                             f"or pass server_data=(x, y) to the constructor")
        x, y = torch.as_tensor(np.asarray(x)), torch.as_tensor(np.asarray(y))
        if len(y) < r:
            raise ValueError(f"fedlrgd: the server needs r = {r} samples, got {len(y)}")
        return x[:r].to(self.device, F64), self._labels(y[:r]).to(self.device)

    def _labels(self, y: torch.Tensor) -> torch.Tensor:
        return y.to(F64) if (self.params.loss != "ce" or y.is_floating_point()) else y.long()

    def loss(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample f(x, y; θ): the configured loss (fedavg.sample_losses) plus mu/2 ‖θ‖²."""
        out = functional_call(self.module, self.spec.unflatten(theta), (x.unsqueeze(0),))
        y = y.unsqueeze(0)
        if self.params.loss == "mse" and y.is_floating_point() and y.numel() != out.numel():
            y = F.one_hot(y.long(), out.shape[-1]).to(F64)  # float class labels as one-hot targets
        return sample_losses(out, y, self.params.loss)[0] + 0.5 * self.params.mu * (theta * theta).sum()

    def objective(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """F(θ) of (1)/(3): the per-sample loss (mu term included) averaged over the server's r samples and
        the clients' samples (x, y), differentiable in θ."""
        xs = torch.cat([self.x0, x.to(self.device, F64)])
        ys = torch.cat([self.y0, self._labels(y).to(self.device)])
        return vmap(self.loss, in_dims=(None, 0, 0))(theta.to(self.device, F64), xs, ys).mean()

    # ---- contract

    def init(self) -> FedLRGDState:
        if self.params.theta0 == "zeros":
            theta = np.zeros(self.spec.size)
        else:
            theta = initial_vector(self.ctx.model, self.ctx.feature_shape, self.ctx.image_shape,
                                   self.ctx.num_classes, self.ctx.seed).astype(np.float64)
        return FedLRGDState(theta)

    def plan(self, state: FedLRGDState, round: int, rng: np.random.Generator) -> Plan:
        t, r = state.epoch + 1, self.params.r
        ph = phase_of(t, r)
        if ph in ("B", "idle"):
            return Plan(np.arange(0, dtype=np.int64), None, ph)
        broadcast: dict[str, Any] = {"row": t - 2}
        if ph == "A":
            broadcast["pivots"] = state.pivots
            if self.params.upload == "weights":
                broadcast["G"] = state.G
        return Plan(np.arange(self.ctx.num_clients), broadcast, ph)

    def client_init(self, client: int) -> None:
        return None

    def step(self, cstate: ClientState | None, data: ClientData, broadcast: dict, rng: np.random.Generator):
        k = broadcast["row"]
        calls = batches = 0
        if k == 0:  # Type A: r s per-sample gradients at the pivots, then the weight solve
            pivots = torch.as_tensor(broadcast["pivots"], device=self.device)
            h = client_sums(self.loss, data.x.to(self.device, F64), self._labels(data.y).to(self.device),
                            pivots, self.params.chunk_size)
            if self.params.upload == "weights":
                h, _ = self._solve(torch.as_tensor(broadcast["G"], device=self.device), h)
            cstate = ClientState(h.cpu().numpy())
            calls, batches = len(data) * len(pivots), len(pivots)
        elif cstate is None:
            raise RuntimeError(f"fedlrgd: client {data.client_id} has no weights in epoch {k + 2}; "
                               "it must take part in epoch 2 (tau = 1)")
        row = np.ascontiguousarray(cstate.rows[k])
        cost = Cost(oracle_calls=calls, oracle_batches=batches, upload_vectors=1.0, upload_bytes=row.nbytes)
        return RowUpload(k, row), cstate, cost

    def reduce(self, replies: list[RowUpload]) -> RowUpload:
        rows = {r.row for r in replies}
        if len(rows) != 1:
            raise ValueError(f"fedlrgd: replies of different rows {sorted(rows)} in one round")
        return RowUpload(replies[0].row, np.sum([r.values for r in replies], axis=0))

    def _solve(self, G: torch.Tensor, H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.params
        return solve_weights(G, H, p.cond_threshold, p.fallback, p.rcond, p.tikhonov)

    def aggregate(self, state: FedLRGDState, replies: list[RowUpload], rng: np.random.Generator):
        t, r, p = state.epoch + 1, self.params.r, self.params
        ph = phase_of(t, r)
        state = replace(state, epoch=t)
        if ph == "idle":
            return state, Cost()
        if t == 1:  # Type B: pivots and G^(i) on the server's r samples
            theta0 = state.params if p.pivot_center == "theta0" else np.zeros_like(state.params)
            size = (r, len(theta0))
            noise = rng.standard_normal(size) if p.pivot_dist == "normal" else rng.uniform(-1.0, 1.0, size)
            pivots = torch.as_tensor(theta0 + p.pivot_scale * noise, device=self.device)
            G = per_sample_grads(self.loss, self.x0, self.y0, pivots)
            cond = condition_numbers(G).cpu().numpy()
            state = replace(state, pivots=pivots.cpu().numpy(), G=G.cpu().numpy(), acc=np.zeros(size),
                            cond_max=float(cond[np.isfinite(cond)].max(initial=0.0)),
                            singular_coords=int((~np.isfinite(cond)).sum()),
                            fallback_coords=int((~(cond <= p.cond_threshold)).sum()))
            return state, Cost(oracle_calls=r * r, oracle_batches=r)
        if ph in ("A", "C"):  # rows t-2 of every client's matrix arrive
            assert state.acc is not None  # phase B's round (epoch 1) made it
            acc = state.acc.copy()
            if replies:
                total = self.reduce(replies)
                if total.row != t - 2:
                    raise ValueError(f"fedlrgd: epoch {t} expects row {t - 2}, got {total.row}")
                acc[total.row] += total.values
            return replace(state, acc=acc), Cost()
        # t == r + 2, Type B: S steps of inexact GD with step 1/L1
        acc = torch.as_tensor(state.acc, device=self.device)
        vbar = self._solve(torch.as_tensor(state.G, device=self.device), acc)[0] if p.upload == "sums" else acc
        theta = inexact_gd(self.loss, self.x0, self.y0, vbar, self.n, torch.as_tensor(state.params, device=self.device),
                           self.lr, p.S)
        return replace(state, params=theta.cpu().numpy()), Cost(oracle_calls=r * p.S, oracle_batches=p.S)

    def vbar(self, state: FedLRGDState) -> torch.Tensor:
        """Σ_c V_c from what the server has received (solving first under `upload: sums`)."""
        acc = torch.as_tensor(state.acc, device=self.device)
        return self._solve(torch.as_tensor(state.G, device=self.device), acc)[0] if self.params.upload == "sums" else acc

    def estimate(self, state: FedLRGDState, theta: np.ndarray | torch.Tensor) -> np.ndarray:
        """The server's gradient estimate ∇F̂(θ) once every row has arrived (r server gradients)."""
        th = torch.as_tensor(theta, device=self.device, dtype=F64)
        g0 = per_sample_grads(self.loss, self.x0, self.y0, th[None])[:, 0]
        return gradient_estimate(g0, self.vbar(state), self.n).cpu().numpy()

    def evaluate(self, state: FedLRGDState, data: EvalData) -> dict[str, float]:
        """Test/train metrics of θ (train_loss on the clients' pooled sample), the objective F(θ) of (3)
        (server's r samples weighted r/n, clients' n − r, mu term included), the worst finite cond(G^(i))
        and the singular and fallback coordinate counts."""
        theta = torch.as_tensor(state.params, device=self.device)
        params = self.spec.unflatten(theta)
        kind = self.params.loss
        test_y, train_y = self._labels(data.test_y.to(self.device)), self._labels(data.train_y.to(self.device))
        with torch.no_grad():
            out = functional_call(self.module, params, (data.test_x.to(self.device, F64),))
            tr = functional_call(self.module, params, (data.train_x.to(self.device, F64),))
            server = functional_call(self.module, params, (self.x0,))
        m: dict[str, float] = {"cond_max": state.cond_max, "singular_coords": float(state.singular_coords),
                               "fallback_coords": float(state.fallback_coords)}
        if kind == "ce" and not test_y.is_floating_point():
            m["test_accuracy"] = float((out.argmax(1) == test_y).double().mean())
        m["test_loss"] = float(sample_losses(out, test_y, kind).mean())
        m["train_loss"] = float(sample_losses(tr, train_y, kind).mean())
        r = self.params.r
        server_loss = float(sample_losses(server, self.y0, kind).mean())
        m["train_objective"] = (((self.n - r) * m["train_loss"] + r * server_loss) / self.n
                                + 0.5 * self.params.mu * float((theta * theta).sum()))
        return m
