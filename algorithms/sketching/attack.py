"""Gradient-leakage attack on a client's sketched upload (the sketching paper).

Threat model (Sec. 7.1): the attacker has hijacked one client of Algorithm 1 with K = 1. It knows the
global model w^t, the shared sketch R_t (from the seed and round, as every client does), the
public step size η_local, the public model (a gradient oracle x ↦ ∇_w F(w, x) it can
differentiate through), and one client's upload R_t Δw_c = −η_local R_t ∇_w F(w, x̃). It runs
sketch-and-solve on x: minimise L_R(x) = ‖R ∇_w F(w, x) − R g‖² with R g = −upload/η_local.

The attacker side is `ThreatView` + `reconstruct`: a view holds exactly the granted objects and
`reconstruct` receives nothing else, so it cannot reach the client's data. The victim side
(`client_upload`) and the experiment driver (`run_attack`, `raysim attack CONFIG`) sit below it.
Optimisers: `gd`, the paper's plain gradient descent (Armijo backtracking); `lm`, Levenberg-
Marquardt on the residual, a stronger attacker (README).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch.func import grad, jacrev

from raysim.algorithms.sketching.privacy import gaussian_sigma
from raysim.algorithms.sketching.sketch import Kind, make_sketch
from raysim.core.rng import stream
from raysim.storage.atomic import write_frame

F64 = torch.float64


# ----------------------------------------------------------------------------- public models


class LinearToy:
    """∇_w F(w, x) = A x + c with A ∈ R^{d×m} of full column rank (README): exact recovery iff rank(RA) = m."""

    def __init__(self, A: torch.Tensor, c: torch.Tensor):
        self.A, self.c = A, c
        self.param_dim, self.input_dim = A.shape

    def grad(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.A @ x + self.c


class TanhMLP:
    """F(x; W, c, v) = ½(vᵀ tanh(W x + c) − y)² with a known label y (README): d = h m + 2h."""

    def __init__(self, input_dim: int, hidden: int, label: float = 1.0):
        self.input_dim, self.hidden, self.label = input_dim, hidden, label
        self.param_dim = hidden * input_dim + 2 * hidden
        self._grad = grad(self.loss)

    def loss(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        m, h = self.input_dim, self.hidden
        W, c, v = w[: h * m].reshape(h, m), w[h * m : h * m + h], w[h * m + h :]
        return 0.5 * (v @ torch.tanh(W @ x + c) - self.label) ** 2

    def grad(self, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self._grad(w, x)


# ----------------------------------------------------------------------------- attacker


@dataclass(frozen=True)
class SketchKey:
    """What common randomness grants: enough to rebuild R_t, never the matrix itself."""

    kind: str
    b: int
    d: int
    seed: int
    round: int
    nnz_per_col: int = 1


@dataclass(frozen=True)
class ThreatView:
    """Everything the threat model grants the attacker (Sec. 7.1), and nothing else."""

    model: LinearToy | TanhMLP  # the public architecture: a differentiable gradient oracle
    params: torch.Tensor  # the global model w^t
    sketch: SketchKey  # R_t through the shared seed
    lr: float  # η_local, a public hyperparameter
    upload: torch.Tensor  # the hijacked client's b numbers, R_t Δw_c


@dataclass
class Reconstruction:
    """The attacker's estimate of the client's input and its final matching loss L_R."""

    x: torch.Tensor
    loss: float


def _residual(view: ThreatView):
    """x ↦ R ∇_w F(w, x) − R g, with R g = −upload/η_local recovered from the upload."""
    k = view.sketch
    R = make_sketch(k.kind, k.b, k.d, k.seed, k.round, k.nnz_per_col, dtype=F64)
    target = -view.upload / view.lr
    return lambda x: R.sk(view.model.grad(view.params, x)) - target


def _gd(res, x0: torch.Tensor, iters: int, tol: float) -> torch.Tensor:
    """Plain gradient descent on L(x) = ‖res(x)‖² with Armijo backtracking (the paper's optimiser)."""
    loss = lambda x: (res(x) ** 2).sum()  # noqa: E731
    dloss = grad(loss)
    x, step = x0, 1.0
    fx = loss(x)
    for _ in range(iters):
        if fx <= tol:
            break
        g = dloss(x)
        gg = float((g * g).sum())
        if gg == 0.0:
            break
        step *= 2.0
        while True:
            x_new = x - step * g
            f_new = loss(x_new)
            if f_new <= fx - 0.5 * step * gg or step < 1e-20:
                break
            step *= 0.5
        if step < 1e-20:
            break
        x, fx = x_new, f_new
    return x


def _lm(res, x0: torch.Tensor, iters: int, tol: float) -> torch.Tensor:
    """Levenberg's damped Gauss-Newton on the residual: solve (JᵀJ + λI) δ = −Jᵀr, adapting λ.

    Steps stay in the row space of J, so on the linear toy with b < m it converges, like GD, to the
    zero of L_R nearest x0 (the toy's closed form); λ > 0 keeps the step defined when JᵀJ is singular.
    """
    jac = jacrev(res)
    x, lam = x0, 1e-3
    r = res(x)
    fx = float((r * r).sum())
    eye = torch.eye(len(x0), dtype=x0.dtype)
    for _ in range(iters):
        if fx <= tol or lam > 1e16:
            break
        J = jac(x)
        A, g = J.T @ J, J.T @ r
        while lam <= 1e16:
            step = torch.linalg.solve(A + lam * eye, -g)
            r_new = res(x + step)
            f_new = float((r_new * r_new).sum())
            if f_new < fx:
                x, r, fx, lam = x + step, r_new, f_new, max(lam / 3.0, 1e-12)
                break
            lam *= 4.0
    return x


def reconstruct(view: ThreatView, rng: np.random.Generator, optimizer: Literal["gd", "lm"] = "gd", restarts: int = 3,
                iters: int = 5000, tol: float = 1e-28) -> Reconstruction:
    """Sketch-and-solve gradient matching (Sec. 7.1): from random x0 ~ N(0, I_m), keep the restart with the lowest L_R."""
    res = _residual(view)
    best: Reconstruction | None = None
    for _ in range(restarts):
        x0 = torch.from_numpy(rng.standard_normal(view.model.input_dim))
        x = _gd(res, x0, iters, tol) if optimizer == "gd" else _lm(res, x0, iters, tol)
        loss = float((res(x) ** 2).sum())
        if best is None or loss < best.loss:
            best = Reconstruction(x.detach(), loss)
        if best.loss <= tol:  # an exact match: no restart can do better
            break
    assert best is not None, "restarts must be >= 1"
    return best


# ----------------------------------------------------------------------------- victim and experiment


def client_upload(model: LinearToy | TanhMLP, params: torch.Tensor, x: torch.Tensor, lr: float, key: SketchKey,
                  noise: torch.Tensor | None = None) -> torch.Tensor:
    """The victim's upload of Algorithm 1/2 with K = 1 on one example: R_t(−η (∇_w F(w, x) [+ ξ]))."""
    g = model.grad(params, x)
    if noise is not None:
        g = g + noise
    R = make_sketch(key.kind, key.b, key.d, key.seed, key.round, key.nnz_per_col, dtype=F64)
    return R.sk(-lr * g)


class AttackModelConfig(BaseModel):
    """The attacked model: the README's tanh MLP (d = h m + 2h) or the linear-gradient toy (d = param_dim)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["tanh_mlp", "linear"] = "tanh_mlp"
    input_dim: int = Field(8, ge=1, description="m, the data dimension")
    hidden: int = Field(16, ge=1, description="h (tanh_mlp)")
    param_dim: int = Field(160, ge=1, description="d (linear)")
    label: float = 1.0


class AttackConfig(BaseModel):
    """`raysim attack CONFIG`: success rate and error vs sketch size b (no DP) and vs per-step ε̂ (DP)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "sketch_attack"
    seed: int = Field(0, ge=0)
    model: AttackModelConfig = Field(default_factory=AttackModelConfig)
    sketch: Kind = "gaussian"
    nnz_per_col: int = Field(1, ge=1)
    b_values: list[int] = Field(default_factory=lambda: [160, 64, 32, 16, 12, 9, 8, 6, 4],
                                description="b = d runs unsketched (kind none)")
    epsilons: list[float] = Field(default_factory=lambda: [1.0, 10.0, 100.0, 1000.0, 10000.0])
    dp_b_values: list[int] = Field(default_factory=lambda: [160, 32], description="sketch sizes of the ε̂ sweep")
    delta: float = Field(1e-5, gt=0, lt=1, description="per-step δ̂ of the DP noise")
    lr: float = Field(0.1, gt=0, description="η_local (public)")
    trials: int = Field(20, ge=1)
    restarts: int = Field(5, ge=1)
    optimizer: Literal["gd", "lm"] = Field("lm", description="gd: the paper's; lm: stronger (labelled)")
    iters: int = Field(200, ge=1, description="iterations per restart (the paper's GD needs ~5000)")
    success_threshold: float = Field(1e-3, gt=0, description="relative error counted as exact recovery")


def make_model(cfg: AttackModelConfig, rng: np.random.Generator) -> LinearToy | TanhMLP:
    """The public model of one trial (the linear toy draws A, c ~ N(0, 1))."""
    if cfg.kind == "tanh_mlp":
        return TanhMLP(cfg.input_dim, cfg.hidden, cfg.label)
    return LinearToy(torch.from_numpy(rng.standard_normal((cfg.param_dim, cfg.input_dim))),
                     torch.from_numpy(rng.standard_normal(cfg.param_dim)))


def attack_trial(cfg: AttackConfig, b: int, epsilon: float | None, trial: int) -> dict:
    """One victim (w ~ N(0, I/m), x̃ ~ N(0, I_m)), its upload, the attack, and the relative error ‖x̂ − x̃‖/‖x̃‖.

    Under DP the victim adds ξ ~ N(0, σ²I) with σ from Lemma H.7, Δ₂ = 2C and C = ‖g‖ (oracle
    clipping, the most attacker-friendly choice).
    """
    rng = stream(cfg.seed, trial, 0, "attack_victim")
    model = make_model(cfg.model, rng)
    d, m = model.param_dim, model.input_dim
    params = torch.from_numpy(rng.standard_normal(d) / math.sqrt(m))
    x_true = torch.from_numpy(rng.standard_normal(m))
    kind = "none" if b == d else cfg.sketch
    key = SketchKey(kind, b, d, cfg.seed, trial + 1, cfg.nnz_per_col)
    noise = None
    if epsilon is not None:
        clip = float(torch.linalg.norm(model.grad(params, x_true)))
        sigma = gaussian_sigma(epsilon, cfg.delta, 2.0 * clip)
        noise = sigma * torch.from_numpy(stream(cfg.seed, trial, 0, "attack_dp").standard_normal(d))
    view = ThreatView(model, params, key, cfg.lr, client_upload(model, params, x_true, cfg.lr, key, noise))
    rec = reconstruct(view, stream(cfg.seed, trial, -1, "attacker"), cfg.optimizer, cfg.restarts, cfg.iters)
    err = float(torch.linalg.norm(rec.x - x_true) / torch.linalg.norm(x_true))
    return {"b": b, "sketch": kind, "epsilon": np.nan if epsilon is None else float(epsilon), "trial": trial,
            "rel_error": err, "success": err < cfg.success_threshold, "attack_loss": rec.loss}


def load_attack_config(path: str | Path) -> AttackConfig:
    """Read the `attack:` section (and name, seed) of an attack YAML; errors (ConfigError) name the file and field."""
    from pydantic import ValidationError

    from raysim.config import ConfigError, read_config_file
    from raysim.core.field_errors import field_errors

    tree = read_config_file(path) or {}
    if not isinstance(tree, dict):
        raise ConfigError("expected a mapping of sections (attack:, name:, seed:)", str(path))
    section = dict(tree.get("attack") or {})
    for key in ("name", "seed"):
        if key in tree:
            section[key] = tree[key]
    try:
        return AttackConfig.model_validate(section)
    except ValidationError as e:
        raise ConfigError(field_errors(e, "attack"), str(path)) from None


def run_attack(cfg: AttackConfig, out: str | Path) -> tuple[Path, Path]:
    """All trials of the b sweep (no DP) and the ε̂ sweep; writes attack.parquet and attack.png to `out`."""
    from raysim.algorithms.sketching.plots import plot_attack

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [{"sweep": "b", **attack_trial(cfg, b, None, t)} for b in cfg.b_values for t in range(cfg.trials)]
    rows += [{"sweep": "epsilon", **attack_trial(cfg, b, e, t)}
             for b in cfg.dp_b_values for e in cfg.epsilons for t in range(cfg.trials)]
    table = pd.DataFrame(rows)
    path = out / "attack.parquet"
    write_frame(table, path)
    return path, plot_attack(table, out / "attack.png", cfg.model.input_dim)
