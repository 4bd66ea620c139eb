"""Kernel FedAvg and FedProx in an RKHS (the kernel FedAvg/FedProx paper), float64, exact.

All clients take part in every round; the server sets f_t = sum_i (n_i/N) f_{i,t}, summing the
replies in client-id order whatever order they arrive in (bitwise reproducible, not reducible).

Two exact forms (`form`):
* `feature` (the experiments' finite-rank kernels `linear`/`monomial`): the model is theta in R^D. FedAvg:
  s steps theta <- theta - eta (Sigma_i theta - b_i); FedProx: theta_i = (I + eta Sigma_i)^{-1}
  (theta + eta b_i), Sigma_i = Phi_i'Phi_i/n_i, b_i = Phi_i'y_i/n_i, kept in the ClientState.
* `representer` (any kernel; (11) as kernel matrices): the model is f = sum_p alpha_p k(., x_p) over the clients'
  support points. The broadcast carries the registered supports and alpha (so each
  client evaluates u_i = f(x_i) itself and caches its cross-Gram rows); a client uploads
  beta_i (and, once, its covariates x_i, which the server registers as supports: not private).
  FedAvg: beta = -(eta/n_i) P_ii r_i by s explicit local steps; FedProx: beta = -(eta/n_i)
  (I + eta K_i)^{-1} r_i with K_i = G_ii/n_i.

Minibatch variant (Sec. 6.1, `batch_size`): a fixed index-order partition; each batch step is on
that batch's share of the local risk, normalised by n_i; FedAvg makes s passes, FedProx one
pass of exact proxes each centred at the running local iterate.

FedProx's `eta` is the paper's prox step; Li et al.'s mu is 1/eta (give one of them).
The pure functions below are the math; the classes only wire them into the contract.

Targets are responses (n,), or the regression sources' rows [response, f_i*(x)] (n, 2), followed
by theta_i* for the finite-rank models (n, 2 + D): clients train on the response; the rest is an
evaluation-only oracle. With it, clients report the SSE of the broadcast f_{t-1} against
f_i* and evaluate() adds ||f_{t-1} - f*||_N^2, the test error against f*, ||theta_t - theta*||
(feature form, when the test truth is one function of the RKHS) and, for `gain_clients`, the
federation gain FG_j (Def. 1) per round (data-scarce clients included, through the carried theta_j*).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import scipy.linalg as sla
from pydantic import BaseModel, ConfigDict, Field, model_validator

from raysim.contract import Algorithm, ClientData, Cost, EvalData, Plan
from raysim.algorithms.kernel.federation_gain import empirical_gain, local_estimator
from raysim.algorithms.kernel.kernels import KERNELS, GPyTorch, as_points, make_kernel
from raysim.errors import ConfigError
from raysim.plugins import register_algorithm

Method = Literal["fedavg", "fedprox"]


# ----------------------------------------------------------------------------- pure math

def batches(n: int, batch_size: int | None) -> list[slice]:
    """The fixed index-order partition of range(n) into batches of `batch_size` (None: one batch)."""
    b = n if batch_size is None else max(1, min(int(batch_size), n))
    return [slice(a, min(a + b, n)) for a in range(0, n, b)]


def local_P(K_loc: np.ndarray, eta: float, method: Method, s: int = 1) -> np.ndarray:
    """P_ii of eq. (10) from K_loc = G_ii/n_i: sum_{tau<s} (I - eta K)^tau, or (I + eta K)^{-1}."""
    mu, V = np.linalg.eigh(K_loc)
    mu = np.clip(mu, 0.0, None)
    if method == "fedprox":
        f = 1.0 / (1.0 + eta * mu)
    else:
        # (1 - (1 - x)^s)/x without cancellation for small x: -expm1(s log1p(-x))/x
        x = eta * mu
        small = x < 0.5
        xs = np.where(small, x, 0.0)
        f_small = np.where(xs > 0, -np.expm1(s * np.log1p(-xs)) / np.where(xs > 0, xs, 1.0), float(s))
        f = np.where(small, f_small, (1.0 - (1.0 - x) ** s) / np.where(small, 1.0, x))
    return (V * f) @ V.T


def global_P(G: np.ndarray, sizes, eta: float, method: Method, s: int = 1) -> np.ndarray:
    """The block-diagonal P of Lemma 1 for clients stacked in order with the given sizes."""
    N = G.shape[0]
    P = np.zeros((N, N))
    a = 0
    for n in sizes:
        P[a:a + n, a:a + n] = local_P(G[a:a + n, a:a + n] / n, eta, method, s)
        a += n
    return P


def kappa(gamma: float, method: Method, s: int = 1) -> float:
    """Condition-number bound (12): gamma s / (1 - (1 - gamma)^s) for FedAvg, 1 + gamma for FedProx."""
    if method == "fedprox":
        return 1.0 + gamma
    if gamma == 0.0:
        return 1.0
    return gamma * s / (1.0 - (1.0 - gamma) ** s)


def centralized_round(f_x: np.ndarray, G: np.ndarray, P: np.ndarray, y: np.ndarray, eta: float) -> np.ndarray:
    """The in-sample LTI recursion (11): f_t(x) = f_{t-1}(x) - eta (G/N) P (f_{t-1}(x) - y)."""
    return f_x - eta * (G @ (P @ (f_x - y))) / len(y)


def fedavg_beta(G_ii: np.ndarray, r: np.ndarray, eta: float, s: int) -> np.ndarray:
    """FedAvg client, representer form, s explicit local steps: beta <- beta - (eta/n)(r + G beta)."""
    n = len(r)
    beta = np.zeros(n)
    for _ in range(s):
        beta = beta - (eta / n) * (r + G_ii @ beta)
    return beta


def fedprox_beta(chol, r: np.ndarray, eta: float) -> np.ndarray:
    """FedProx client, representer form: -(eta/n)(I + eta G/n)^{-1} r, given cho_factor(I + eta G/n)."""
    return -(eta / len(r)) * sla.cho_solve(chol, r)


def prox_factor(G_or_Sigma: np.ndarray, scale: float):
    """cho_factor(I + scale * A) for a PSD A."""
    return sla.cho_factor(np.eye(len(G_or_Sigma)) + scale * G_or_Sigma, lower=True)


def minibatch_beta(G_ii: np.ndarray, r: np.ndarray, eta: float, method: Method, s: int,
                   batch_size: int | None) -> np.ndarray:
    """Sec. 6.1's minibatches in representer form: f = f_{t-1} + beta.k_{x_i}; r = f_{t-1}(x_i) - y_i.

    FedAvg: s passes of beta_b <- beta_b - (eta/n)(r_b + G_{b,:} beta); FedProx: one pass of
    beta_b <- beta_b - (eta/n)(I + (eta/n) G_bb)^{-1}(r_b + G_{b,:} beta).
    """
    n = len(r)
    beta = np.zeros(n)
    parts = batches(n, batch_size)
    for _ in range(s if method == "fedavg" else 1):
        for b in parts:
            res = r[b] + G_ii[b] @ beta
            if method == "fedavg":
                beta[b] -= (eta / n) * res
            else:
                beta[b] -= (eta / n) * np.linalg.solve(np.eye(b.stop - b.start) + (eta / n) * G_ii[b, b], res)
    return beta


def feature_stats(Phi: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Sigma_i, b_i) = (Phi'Phi/n, Phi'y/n)."""
    n = len(y)
    return Phi.T @ Phi / n, Phi.T @ y / n


def fedavg_theta(theta: np.ndarray, Sigma: np.ndarray, b: np.ndarray, eta: float, s: int) -> np.ndarray:
    """FedAvg client, feature form: s steps theta <- theta - eta (Sigma theta - b)."""
    for _ in range(s):
        theta = theta - eta * (Sigma @ theta - b)
    return theta


def fedprox_theta(theta: np.ndarray, chol, b: np.ndarray, eta: float) -> np.ndarray:
    """FedProx client, feature form: (I + eta Sigma)^{-1}(theta + eta b), given cho_factor(I + eta Sigma)."""
    return sla.cho_solve(chol, theta + eta * b)


def minibatch_theta(theta: np.ndarray, Phi: np.ndarray, y: np.ndarray, eta: float, method: Method, s: int,
                    batch_size: int | None) -> np.ndarray:
    """Sec. 6.1's minibatches in feature form: FedAvg s passes of theta <- theta - (eta/n) Phi_b'(Phi_b theta - y_b);
    FedProx one pass of theta <- (I + (eta/n) Phi_b'Phi_b)^{-1}(theta + (eta/n) Phi_b'y_b)."""
    n = len(y)
    D = Phi.shape[1]
    parts = batches(n, batch_size)
    for _ in range(s if method == "fedavg" else 1):
        for b in parts:
            Pb, yb = Phi[b], y[b]
            if method == "fedavg":
                theta = theta - (eta / n) * (Pb.T @ (Pb @ theta - yb))
            else:
                theta = np.linalg.solve(np.eye(D) + (eta / n) * (Pb.T @ Pb), theta + (eta / n) * (Pb.T @ yb))
    return theta


def preconditioner(Sigma: np.ndarray, eta: float, method: Method, s: int = 1) -> np.ndarray:
    """C_i of the feature form: eta sum_{tau<s} (I - eta Sigma)^tau, or eta (I + eta Sigma)^{-1}."""
    return eta * local_P(Sigma, eta, method, s)


def fixed_point_solver(Sigmas, weights, eta: float, method: Method, s: int = 1):
    """bs -> theta_inf for fixed covariates: the map of `fixed_point`, factored once (sweeps over responses)."""
    D = Sigmas[0].shape[0]
    A, WC = np.zeros((D, D)), []
    for S, w in zip(Sigmas, weights):
        C = preconditioner(S, eta, method, s)
        A += w * (C @ S)
        WC.append(w * C)
    A_pinv = np.linalg.pinv(A)

    def solve(bs) -> np.ndarray:
        c = np.zeros(D)
        for wc, b in zip(WC, bs):
            c += wc @ b
        return A_pinv @ c

    return solve


def fixed_point(Sigmas, bs, weights, eta: float, method: Method, s: int = 1) -> np.ndarray:
    """theta_inf = (sum w_i C_i Sigma_i)^+ sum w_i C_i b_i (full-batch; pinv leaves unseen coordinates at 0)."""
    return fixed_point_solver(Sigmas, weights, eta, method, s)(bs)


def expected_prediction_error(G: np.ndarray, sizes, truth: np.ndarray, sigma: float, eta: float, method: Method,
                              s: int, rounds) -> np.ndarray:
    """E_xi ||f_t - f*||_N^2 from f_0 = 0 at each t in `rounds`, exactly (README, general kernel): with L = I - eta K_x P,
    f_t(x) - f*(x) = -L^t f*(x) + (I - L^t) xi, so the error is (||L^t f*||^2 + sigma^2 ||I - L^t||_F^2)/N.
    K_x P is similar to the symmetric S = P^1/2 K_x P^1/2 = U diag(lam) U', so L^t = V diag((1 - eta lam)^t) W
    with V = P^-1/2 U, W = U' P^1/2."""
    N = len(truth)
    mu, Q = np.linalg.eigh(global_P(G, sizes, eta, method, s))
    mu = np.clip(mu, 1e-300, None)
    half, inv_half = (Q * np.sqrt(mu)) @ Q.T, (Q / np.sqrt(mu)) @ Q.T
    lam, U = np.linalg.eigh(half @ (G / N) @ half)
    V, W = inv_half @ U, U.T @ half
    H = (V.T @ V) * (W @ W.T)  # ||V diag(a) W||_F^2 = a' H a
    Wf, decay = W @ truth, 1.0 - eta * lam
    out = []
    for t in rounds:
        d = decay ** t
        bias = V @ (d * Wf)
        a = 1.0 - d
        out.append((bias @ bias + sigma ** 2 * (a @ H @ a)) / N)
    return np.array(out)


def global_gradient(theta: np.ndarray, Sigmas, bs, weights) -> np.ndarray:
    """grad l(theta) = sum w_i (Sigma_i theta - b_i) for l = sum w_i l_i (Sec. 3; Sec. 6.1's is twice this)."""
    return sum(w * (S @ theta - b) for S, b, w in zip(Sigmas, bs, weights))


def truth_coefficients(Phi: np.ndarray, truth: np.ndarray, rtol: float = 1e-9) -> np.ndarray | None:
    """The theta* with Phi theta* = truth when these noise-free values pin down one function of the
    RKHS (Phi of full column rank, truth consistent to rtol); None otherwise (too few points, or
    truths of different clients)."""
    if len(truth) < Phi.shape[1]:
        return None
    theta, _, rank, _ = np.linalg.lstsq(Phi, truth, rcond=None)
    if rank < Phi.shape[1] or np.linalg.norm(Phi @ theta - truth) > rtol * max(1.0, float(np.linalg.norm(truth))):
        return None
    return theta


# ----------------------------------------------------------------------------- contract

class KernelFedAvgParams(BaseModel):
    """Kernel FedAvg: s local full-batch (or Sec. 6.1 minibatch) functional GD steps of step eta."""

    model_config = ConfigDict(extra="forbid")

    form: Literal["feature", "representer"] = "feature"
    kernel: Literal["linear", "monomial", "rbf", "matern", "sobolev"] = "linear"
    degree: int = Field(5, ge=0, description="monomial kernel: features 1, x, ..., x^degree")
    lengthscale: float = Field(1.0, gt=0, description="rbf / matern")
    variance: float = Field(1.0, gt=0, description="rbf / matern")
    nu: float = Field(2.5, description="matern smoothness: 0.5, 1.5 or 2.5")
    backend: Literal["raysim", "gpytorch"] = Field("raysim", description="Gram provider of rbf / matern")
    eta: float = Field(0.1, gt=0)
    local_steps: int = Field(1, ge=1, description="s")
    batch_size: int | None = Field(None, ge=1, description="None: full local batch")
    gain_clients: list[int] = Field(default_factory=list,
                                    description="clients whose federation gain FG_j is evaluated (feature form)")

    @model_validator(mode="after")
    def _form_fits_kernel(self):
        if self.form == "feature" and self.kernel not in ("linear", "monomial"):
            raise ValueError(f"form: feature needs a finite-rank kernel (linear, monomial), not {self.kernel!r}")
        if self.backend == "gpytorch" and self.kernel not in ("rbf", "matern"):
            raise ValueError(f"backend: gpytorch provides rbf and matern, not {self.kernel!r}")
        if self.gain_clients and self.form != "feature":
            raise ValueError("gain_clients: the federation gain needs form: feature")
        if self.kernel == "matern" and self.nu not in (0.5, 1.5, 2.5):
            raise ValueError("nu must be 0.5, 1.5 or 2.5")
        return self


class KernelFedProxParams(KernelFedAvgParams):
    """Kernel FedProx: the proximal problem solved exactly; prox step eta, or Li et al.'s mu = 1/eta."""

    mu: float | None = Field(None, gt=0, description="if set, eta = 1/mu")

    @model_validator(mode="after")
    def _mu(self):
        if self.local_steps != 1:
            raise ValueError("FedProx has no local_steps")
        if self.mu is not None:
            if "eta" in self.model_fields_set and not math.isclose(self.eta, 1.0 / self.mu, rel_tol=1e-12):
                raise ValueError("give eta or mu = 1/eta, not both")
            self.eta = 1.0 / self.mu
        return self


def kernel_of(p: KernelFedAvgParams):
    """The kernel object the params name."""
    if p.backend == "gpytorch":
        return GPyTorch(p.kernel, p.lengthscale, p.variance, p.nu)
    if p.kernel == "monomial":
        return make_kernel("monomial", degree=p.degree)
    if p.kernel == "rbf":
        return make_kernel("rbf", lengthscale=p.lengthscale, variance=p.variance)
    if p.kernel == "matern":
        return make_kernel("matern", nu=p.nu, lengthscale=p.lengthscale, variance=p.variance)
    return make_kernel(p.kernel)


def _float64(y) -> np.ndarray:
    if hasattr(y, "detach"):
        y = y.detach().cpu().numpy()
    return np.asarray(y, dtype=np.float64)


def split_targets(y) -> tuple[np.ndarray, np.ndarray | None]:
    """(responses, noise-free truth or None) as float64 (torch or numpy): 1-D targets are
    responses; (n, k >= 2) targets are the regression sources' [response, f*(x), theta* ...]."""
    y = _float64(y)
    if y.ndim == 2 and y.shape[1] >= 2:
        return y[:, 0], y[:, 1]
    return y.reshape(-1), None


def truth_theta(Phi: np.ndarray, y, rtol: float = 1e-9) -> np.ndarray | None:
    """theta* of rows whose truth is one function of the RKHS: the coefficients the finite-rank
    regression sources carry after [response, f*(x)] when all rows carry the same ones and they
    give f*(x) = Phi theta* (to rtol), which holds for a data-scarce client (n_j < D) too; else
    `truth_coefficients` of the truth values (None for rows of different truths)."""
    y = _float64(y)
    _, truth = split_targets(y)
    if truth is None:
        return None
    coefs = y[:, 2:]
    if len(coefs) and coefs.shape[1] == Phi.shape[1] and np.all(coefs == coefs[0]):
        theta = coefs[0]
        if np.linalg.norm(Phi @ theta - truth) <= rtol * max(1.0, float(np.linalg.norm(truth))):
            return theta
    return truth_coefficients(Phi, truth, rtol)


@dataclass
class GainReference:
    """Client j's side of FG_j: its local min-norm least squares, its truth coefficients when its
    rows determine them (`truth_theta`; else None), and its truth values (Phi_j, f_j*(x_j))."""

    client: int
    theta_local: np.ndarray
    theta_star: np.ndarray | None
    Phi: np.ndarray
    truth: np.ndarray


@dataclass
class FeatureState:
    """Feature-form ServerState: theta_t, and l(theta_{t-1}), grad l(theta_{t-1}) and
    ||f_{t-1} - f*||_N^2 from the last replies; the FG references (constant)."""

    theta: np.ndarray
    loss: float = float("nan")
    grad: np.ndarray | None = None
    pred_error: float = float("nan")
    gains: tuple = ()


@dataclass
class RepresenterModel:
    """f = sum_p alpha_p k(., x_p): supports and coefficients of the registered clients, in id order."""

    ids: tuple
    supports: dict = field(default_factory=dict)  # client id -> x_i (n_i, p)
    alpha: dict = field(default_factory=dict)  # client id -> alpha_i (n_i,)

    def stacked(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.ids:
            return np.zeros((0, 1)), np.zeros(0)
        return (np.concatenate([self.supports[c] for c in self.ids]),
                np.concatenate([self.alpha[c] for c in self.ids]))


@dataclass
class RepresenterState:
    """Representer-form ServerState: the model, and l(f_{t-1}), ||f_{t-1} - f*||_N^2 from the last replies."""

    model: RepresenterModel
    loss: float = float("nan")
    pred_error: float = float("nan")


@dataclass
class KernelReply:
    """A client's upload: theta_i (feature) or beta_i (representer), its size, its local loss,
    gradient and SSE against f_i* at the broadcast (diagnostics), and its covariates when the
    server lacks them."""

    client_id: int
    n: int
    vec: np.ndarray
    loss: float
    grad: np.ndarray | None = None
    support: np.ndarray | None = None
    sse: float | None = None


@dataclass
class FeatureClient:
    """Feature-form ClientState: Phi_i, y_i, Sigma_i, b_i, cho_factor(I + eta Sigma_i), f_i*(x_i) or None."""

    Phi: np.ndarray
    y: np.ndarray
    Sigma: np.ndarray
    b: np.ndarray
    chol: Any = None
    truth: np.ndarray | None = None


@dataclass
class RepresenterClient:
    """Representer-form ClientState: x_i, y_i, G_ii, cho_factor(I + eta G_ii/n_i) for FedProx,
    the cross-Gram k(x_i, supports) cached for the support ids it was built on, and f_i*(x_i) or None."""

    x: np.ndarray
    y: np.ndarray
    G: np.ndarray
    chol: Any = None
    cross: np.ndarray | None = None
    cross_ids: tuple = ()
    truth: np.ndarray | None = None


@register_algorithm("kernel_fedavg")
class KernelFedAvg(Algorithm):
    """Kernel FedAvg (and, via `method`, FedProx), exact, full participation, weights n_i/N."""

    Params = KernelFedAvgParams
    reducible = False
    method: Method = "fedavg"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.kernel = kernel_of(self.params)
        self.sizes = np.asarray(ctx.client_sizes, dtype=np.int64)
        self.N = int(self.sizes.sum())

    @property
    def s(self) -> int:
        return self.params.local_steps if self.method == "fedavg" else 1

    # -- server
    def init(self):
        if self.params.form == "representer":
            return RepresenterState(RepresenterModel(ids=()))
        D = int(np.prod(self.ctx.feature_shape)) if self.params.kernel == "linear" else self.params.degree + 1
        return FeatureState(np.zeros(D), gains=self._gain_references())

    def _gain_references(self) -> tuple:
        """Server-side evaluation data for FG_j (Definition 1): client j's rows from the training file."""
        if not self.params.gain_clients:
            return ()
        from raysim.data import read_clients

        bad = [j for j in self.params.gain_clients if not 0 <= j < self.ctx.num_clients]
        if bad:
            raise ConfigError(f"algorithm.gain_clients: {bad} are not clients 0..{self.ctx.num_clients - 1}")
        refs = []
        assert self.ctx.train_path is not None, "a run's Context names its train.parquet"
        for j, (x, y) in sorted(read_clients(self.ctx.train_path, self.params.gain_clients).items()):
            response, truth = split_targets(y)
            if truth is None:
                raise ConfigError("algorithm.gain_clients: the federation gain needs a regression source with "
                                 "noise-free truth (targets [response, f*(x)]), e.g. data.source linear_regression")
            Phi = self.kernel.features(x)
            refs.append(GainReference(j, local_estimator(Phi, response), truth_theta(Phi, y), Phi, truth))
        return tuple(refs)

    def plan(self, state, round: int, rng: np.random.Generator) -> Plan:
        broadcast = state.model if self.params.form == "representer" else state.theta
        return Plan(np.arange(self.ctx.num_clients), broadcast)

    def aggregate(self, state, replies: list[KernelReply], rng) -> tuple[Any, Cost]:
        if not replies:
            return state, Cost()
        replies = sorted(replies, key=lambda r: r.client_id)  # fixed order: bitwise reproducible
        loss = 0.0
        for r in replies:
            loss += (r.n / self.N) * r.loss
        pred_error = float("nan")
        if all(r.sse is not None for r in replies):
            pred_error = 0.0
            for r in replies:
                pred_error += r.sse / self.N
        if self.params.form == "feature":
            theta = np.zeros_like(state.theta)
            grad = np.zeros_like(state.theta)
            for r in replies:
                theta += (r.n / self.N) * r.vec
                grad += (r.n / self.N) * r.grad
            return FeatureState(theta, loss, grad, pred_error, state.gains), Cost()
        old = state.model
        supports, alpha = dict(old.supports), dict(old.alpha)
        for r in replies:
            c = r.client_id
            if c not in supports:
                supports[c] = r.support
                alpha[c] = np.zeros(r.n)
            alpha[c] = alpha[c] + (r.n / self.N) * r.vec
        return RepresenterState(RepresenterModel(tuple(sorted(supports)), supports, alpha), loss, pred_error), Cost()

    # -- client
    def _client_state(self, data: ClientData):
        y, truth = split_targets(data.y)
        x = as_points(data.x)
        if self.params.form == "feature":
            Phi = self.kernel.features(x)
            Sigma, b = feature_stats(Phi, y)
            chol = prox_factor(Sigma, self.params.eta) if self.method == "fedprox" else None
            return FeatureClient(Phi, y, Sigma, b, chol, truth)
        G = self.kernel.gram(x, x)
        chol = prox_factor(G, self.params.eta / len(y)) if self.method == "fedprox" else None
        return RepresenterClient(x, y, G, chol, truth=truth)

    @staticmethod
    def _sse(pred: np.ndarray, truth: np.ndarray | None) -> float | None:
        return None if truth is None else float((pred - truth) @ (pred - truth))

    def _cost(self, n: int, vec: np.ndarray, extra_bytes: int = 0) -> Cost:
        nb = len(batches(n, self.params.batch_size))
        passes = self.s if self.method == "fedavg" else 1
        up = 1.0 if self.params.form == "feature" else n / self.N
        return Cost(oracle_calls=passes * n, oracle_batches=passes * nb, upload_vectors=up,
                    upload_bytes=vec.nbytes + extra_bytes)

    def step(self, cstate, data: ClientData, broadcast, rng: np.random.Generator):
        cs = cstate if cstate is not None else self._client_state(data)
        p, n = self.params, len(cs.y)
        if p.form == "feature":
            theta = np.asarray(broadcast, dtype=np.float64)
            pred = cs.Phi @ theta
            resid = pred - cs.y
            grad = cs.Sigma @ theta - cs.b
            if p.batch_size is not None and p.batch_size < n:
                new = minibatch_theta(theta, cs.Phi, cs.y, p.eta, self.method, self.s, p.batch_size)
            elif self.method == "fedprox":
                new = fedprox_theta(theta, cs.chol, cs.b, p.eta)
            else:
                new = fedavg_theta(theta, cs.Sigma, cs.b, p.eta, self.s)
            reply = KernelReply(data.client_id, n, new, float(resid @ resid) / (2 * n), grad, sse=self._sse(pred, cs.truth))
            return reply, cs, self._cost(n, new)
        model: RepresenterModel = broadcast
        if model.ids:
            if cs.cross_ids != model.ids:
                X, _ = model.stacked()
                cs.cross, cs.cross_ids = self.kernel.gram(cs.x, X), model.ids
            u = cs.cross @ model.stacked()[1]
        else:
            u = np.zeros(n)
        r = u - cs.y
        if p.batch_size is not None and p.batch_size < n:
            beta = minibatch_beta(cs.G, r, p.eta, self.method, self.s, p.batch_size)
        elif self.method == "fedprox":
            beta = fedprox_beta(cs.chol, r, p.eta)
        else:
            beta = fedavg_beta(cs.G, r, p.eta, self.s)
        support = None if data.client_id in model.supports else cs.x
        reply = KernelReply(data.client_id, n, beta, float(r @ r) / (2 * n), None, support, self._sse(u, cs.truth))
        return reply, cs, self._cost(n, beta, 0 if support is None else support.nbytes)

    # -- export
    def export(self, state: FeatureState | RepresenterState) -> dict[str, Any]:
        """f_t whole, so that it can be evaluated again (`raysim export` writes it as a .npz with dotted names):
        `kernel.type` (a KERNELS name) and `kernel.<hyperparameter>`, so `make_kernel` rebuilds the kernel; the
        feature form's `theta` (f = features(x) @ theta), or the representer form's supports stacked in client-id
        order, `representer.supports` (N, p), and their coefficients `representer.alpha` (N,) (f = gram(x,
        supports) @ alpha), with `representer.ids` and `representer.sizes` marking each client's block; and the
        state's diagnostics of the last replies. Not the FG references: client j's training rows, evaluation
        data rather than the model."""
        kind = next(name for name, cls in KERNELS.items() if type(self.kernel) is cls)
        out: dict[str, Any] = {"kernel": {"type": kind, **dataclasses.asdict(self.kernel)}}
        if isinstance(state, FeatureState):
            return {**out, "theta": state.theta, "loss": state.loss, "grad": state.grad, "pred_error": state.pred_error}
        model = state.model
        supports, alpha = model.stacked()
        sizes = np.array([len(model.alpha[c]) for c in model.ids], dtype=np.int64)
        representer = {"supports": supports, "alpha": alpha, "ids": np.array(model.ids, dtype=np.int64), "sizes": sizes}
        return {**out, "representer": representer, "loss": state.loss, "pred_error": state.pred_error}

    # -- evaluation
    def predict(self, state, x) -> np.ndarray:
        """f_t at the points x."""
        if self.params.form == "feature":
            return self.kernel.features(x) @ state.theta
        X, alpha = state.model.stacked()
        if len(alpha) == 0:
            return np.zeros(len(as_points(x)))
        return self.kernel.gram(x, X) @ alpha

    def evaluate(self, state, data: EvalData) -> dict[str, float]:
        """From the clients' diagnostics, one round late: l(f_{t-1}), ||grad l(theta_{t-1})|| (feature
        form; Sec. 3 and Sec. 6.1 conventions) and ||f_{t-1} - f*||_N^2 (`pred_error_prev`). Of f_t:
        the test and train MSE against the responses, `test_error` (MSE against f*), `coef_error`
        ||theta_t - theta*|| = ||f_t - f*||_H and `fg_client_j` (feature form, where f* is known)."""
        out = {"train_loss_prev": float(state.loss)}
        if not np.isnan(state.pred_error):
            out["pred_error_prev"] = float(state.pred_error)
        if self.params.form == "feature" and state.grad is not None:
            g = float(np.linalg.norm(state.grad))
            out.update(grad_norm_prev=g, grad_norm_sec61_prev=2.0 * g)
        for key, x, y in (("test", data.test_x, data.test_y), ("train", data.train_x, data.train_y)):
            response, truth = split_targets(y) if x is not None else (np.zeros(0), None)
            if len(response):
                pred = self.predict(state, x)
                out[f"{key}_mse"] = float(np.mean((pred - response) ** 2))
                if truth is not None:
                    out[f"{key}_error"] = float(np.mean((pred - truth) ** 2))
        if self.params.form == "feature":
            out.update(self._coefficient_metrics(state, data))
        return out

    def _coefficient_metrics(self, state: FeatureState, data: EvalData) -> dict[str, float]:
        """||theta_t - theta*|| when the test truth is one function of the RKHS, and the empirical FG_j with
        theta_j* from client j's rows (`truth_theta`) or, failing that, the test truth if it fits them."""
        star = None if data.test_x is None else truth_theta(self.kernel.features(data.test_x), data.test_y)
        out = {} if star is None else {"coef_error": float(np.linalg.norm(state.theta - star))}
        for ref in state.gains:
            theta_j = ref.theta_star
            if theta_j is None and star is not None and np.allclose(ref.Phi @ star, ref.truth, rtol=1e-9, atol=1e-9):
                theta_j = star
            if theta_j is not None:
                out[f"fg_client_{ref.client}"] = empirical_gain(ref.theta_local, state.theta, theta_j)
        return out


@register_algorithm("kernel_fedprox")
class KernelFedProx(KernelFedAvg):
    """Kernel FedProx: argmin_f l_i(f) + ||f - f_{t-1}||_H^2 / (2 eta), solved exactly."""

    Params = KernelFedProxParams
    method: Method = "fedprox"
