"""FZooS: federated zeroth-order optimisation with trajectory-informed surrogate gradients
(the FZooS paper's Algo. 2, defaults of App. E and, where it is silent, the official code).

A communication round has two phases (two synchronisations, Algo. 2):
* "local": from x_{r-1}, T Adam steps on g = grad mu_i(x) (eq. (5), the GP on the K_gp history
  points nearest to x) + gamma_t (grad mu_hat_{r-1}(x) - grad mu_hat_i(x)) (eq. (8), the shared
  RFF surrogates), one query per iterate and 5 active queries of largest gradient uncertainty
  after every step but the last; upload x_{r,T}^(i) (d floats).
* "surrogate": at the new x_r, one query and 50 active queries in a box of half-width
  mean|x_r - x_{r,T}^(i)|/2, then the RFF weights of the K_rff nearest points; upload w_i (M floats).
Queries per client and round: 1 + T + 5(T-1) + 1 + 50 = 107 at T = 10, plus 10 initial ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from raysim.contract import ClientData, Cost
from raysim.plugins import register_algorithm
from raysim.algorithms.fzoos import gp, rff
from raysim.algorithms.fzoos.family import ZOBroadcast, ZOFamily, ZOParams, ZOReply, ZOState
from raysim.algorithms.fzoos.history import History


class FZooSParams(ZOParams):
    """FZooS's hyperparameters; the ablations of App. F are `gamma` and `correction_vector`."""

    num_features: int = Field(10_000, ge=1, description="M, random Fourier features")
    lengthscale: float = Field(1.0, gt=0, description="SE length scale of the GP and the RFF")
    lengthscale_fit: Literal["fixed", "ml2"] = Field("fixed", description="ml2: refit l by marginal likelihood "
                                                      "at every step for the gradient and the active-query GP alike; the RFF keeps `lengthscale`")
    ml2_steps: int = Field(20, ge=1)
    noise: float = Field(1e-6, gt=0, description="sigma^2 of the GP and the RFF fit, on normalised targets")
    gp_window: int = Field(150, ge=1, description="K_gp nearest history points of the local GP")
    rff_window: int = Field(500, ge=1, description="K_rff nearest history points of the RFF fit")
    init_points: int = Field(10, ge=0, description="initial design: points uniform in x0 +- init_radius")
    init_radius: float = Field(0.01, gt=0)
    active_local: int = Field(5, ge=0, description="active queries after each local step but the last")
    active_local_candidates: int = Field(100, ge=1)
    active_local_radius: float = Field(0.01, gt=0)
    active_end: int = Field(50, ge=0, description="active queries around x_r at the end of a round")
    active_end_candidates: int = Field(200, ge=1)
    uncertainty: Literal["trace", "first_coord"] = Field("trace", description="active-query score (first_coord: the official code's)")
    gamma: Literal["inv_t", "const", "floored"] = Field("inv_t", description="correction length: 1/t (paper), "
                                                        "gamma_value, or max(1/t, gamma_min)")
    gamma_value: float = Field(1.0, ge=0)
    gamma_min: float = Field(0.1, ge=0, le=1)
    correction_vector: Literal["adaptive", "fixed"] = Field("adaptive", description="surrogates at the current "
                                                            "iterate (eq. (8)) or frozen at x_{r-1} (ablation)")


def correction_length(kind: str, t: int, value: float, floor: float) -> float:
    """gamma_{r,t-1} for the 1-based local step t (eq. (8), App. E; README for C = 50)."""
    if kind == "const":
        return value
    return max(1.0 / t, floor) if kind == "floored" else 1.0 / t


@dataclass
class FZooSClient:
    """A client's persistent state: its query history, last local iterate and own RFF weights."""

    history: History
    x_local: Tensor | None = None
    w_own: Tensor | None = None


@register_algorithm("fzoos")
class FZooS(ZOFamily):
    """FZooS (Algo. 2) with active queries and the adaptive gradient correction of eq. (8)."""

    Params = FZooSParams
    phases = ("local", "surrogate")

    def client_init(self, client: int) -> FZooSClient:
        return FZooSClient(History(self.dim))

    @property
    def features(self) -> rff.RandomFeatures:
        """The shared random features (drawn from the experiment seed, the same in every process)."""
        p = self.params
        return rff.shared_features(self.ctx.seed, p.num_features, self.dim, p.lengthscale)

    def _gp(self, history: History, x: Tensor, with_values: bool) -> gp.GradientGP:
        p = self.params
        X, y = history.nearest(x, p.gp_window)
        ell = p.lengthscale
        if p.lengthscale_fit == "ml2" and len(X) > 1:
            ell = gp.fit_lengthscale(X, y, ell, p.noise, p.ml2_steps)
        return gp.fit(X, y if with_values else None, ell, p.noise, center=x)

    def _active(self, state: FZooSClient, client: int, x: Tensor, radius: Tensor | float, candidates: int,
                top: int, rng: np.random.Generator) -> int:
        """Query the `top` of `candidates` points x + radius*U[-1,1]^d with the largest gradient uncertainty."""
        if top == 0:
            return 0
        C = x + radius * torch.from_numpy(rng.uniform(-1.0, 1.0, (candidates, self.dim)))
        if self.params.clip_iterates:
            C = C.clamp(0.0, 1.0)
        model = self._gp(state.history, x, with_values=False)
        score = gp.grad_cov_trace(model, C) if self.params.uncertainty == "trace" else gp.grad_var_first(model, C)
        chosen = C[torch.topk(score, min(top, candidates)).indices]
        state.history.add(chosen, self.query(client, chosen, rng))
        return len(chosen)

    def step(self, cstate: FZooSClient, data: ClientData, broadcast: ZOBroadcast, rng: np.random.Generator
             ) -> tuple[ZOReply, FZooSClient, Cost]:
        if broadcast.phase == "local":
            return self._local(cstate, data.client_id, broadcast, rng)
        return self._surrogate(cstate, data.client_id, broadcast, rng)

    def _local(self, state: FZooSClient, client: int, b: ZOBroadcast, rng: np.random.Generator):
        """T local steps on the corrected GP gradient of eq. (8), with active queries."""
        p = self.params
        x = b.x.clone()
        queries = 0
        if state.history.n == 0 and p.init_points:
            U = x + p.init_radius * torch.from_numpy(rng.uniform(-1.0, 1.0, (p.init_points, self.dim)))
            U = U.clamp(0.0, 1.0) if p.clip_iterates else U
            state.history.add(U, self.query(client, U, rng))
            queries += p.init_points
        state.history.add(x[None], self.query(client, x[None], rng))
        queries += 1
        dw = None if b.shared is None or state.w_own is None else b.shared - state.w_own
        fixed = None if dw is None else rff.surrogate_grad(self.features, dw, b.x)
        opt, cosines = self.optimizer(), []
        for t in range(1, p.local_steps + 1):
            g = gp.mean_grad(self._gp(state.history, x, with_values=True), x)
            if dw is not None:
                vector = rff.surrogate_grad(self.features, dw, x) if p.correction_vector == "adaptive" else fixed
                assert vector is not None  # fixed is None only without dw
                g = g + correction_length(p.gamma, t, p.gamma_value, p.gamma_min) * vector
            if p.track_cosine:
                cosines.append(self.cosine(g, x))
            x = opt.step(x, g)
            state.history.add(x[None], self.query(client, x[None], rng))
            queries += 1
            if t < p.local_steps:
                queries += self._active(state, client, x, p.active_local_radius, p.active_local_candidates,
                                        p.active_local, rng)
        state.x_local = x
        reply = ZOReply(client, (x,), torch.tensor(cosines, dtype=torch.float64) if cosines else None)
        return reply, state, self.cost(queries, self.dim)

    def _surrogate(self, state: FZooSClient, client: int, b: ZOBroadcast, rng: np.random.Generator):
        """Queries around the new x_r and the client's RFF weights of eq. (6)."""
        p = self.params
        x = b.x
        state.history.add(x[None], self.query(client, x[None], rng))
        assert state.x_local is not None  # the local phase before this one set it
        radius = (x - state.x_local).abs().mean() / 2.0
        queries = 1 + self._active(state, client, x, radius, p.active_end_candidates, p.active_end, rng)
        X, y = state.history.nearest(x, p.rff_window)
        state.w_own = rff.fit_weights(self.features, X, y, p.noise)
        return ZOReply(client, (state.w_own,)), state, self.cost(queries, p.num_features)

    def shared_after(self, phase: str, means: list[Tensor], state: ZOState) -> Tensor | None:
        """Eq. (7): the global surrogate's weights are the mean of the clients' weights."""
        return means[0] if phase == "surrogate" else state.shared
