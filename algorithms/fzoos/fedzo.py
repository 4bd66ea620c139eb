"""The finite-difference baselines of FZooS (the FZooS paper): FedZO and the zeroth-order forms of
FedProx and SCAFFOLD (Types I and II), all instances of eq. (2) with the FD estimator of eq. (3).

Every local step estimates Delta_i(x) from Q queries at x + lambda u_q and y_i(x) (the query at
the previous iterate), then takes an Adam step; a round costs 1 + T(Q + 1) queries per client
(211 at T = 10, Q = 20). SCAFFOLD-I adds a second phase with Q + 1 queries at x_r (counted, unlike in the official code).
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
from raysim.algorithms.fzoos.estimators import directions, fd_gradient, unbiased_scale
from raysim.algorithms.fzoos.family import ZOBroadcast, ZOFamily, ZOParams, ZOReply, ZOState


class FedZOParams(ZOParams):
    """The FD estimator: Q directions, smoothing lambda, their kind and the scale (README)."""

    directions: int = Field(20, ge=1, description="Q")
    smoothing: float = Field(0.01, gt=0, description="lambda (the code's `mu`)")
    fd_directions: Literal["gaussian", "orthonormal"] = "gaussian"
    fd_scale: Literal["unbiased", "inv_q", "d_over_q"] = Field(
        "unbiased", description="unbiased: 1/Q for Gaussian, d/Q for orthonormal directions (README); "
        "inv_q with orthonormal directions is the official code's, whose mean is grad f / d")


class ZOFedProxParams(FedZOParams):
    """FedProx adds prox * (x - x_{r-1}) to the FD estimate (eq. (89); 1 as in the official code)."""

    prox: float = Field(1.0, ge=0, description="the proximal weight gamma")


@dataclass
class FDClient:
    """A client's control variate c_i (SCAFFOLD), None before it has one."""

    control: Tensor | None = None


@register_algorithm("fedzo")
class FedZO(ZOFamily):
    """FedZO (eq. (87)): local Adam on the FD estimate, the server averages the iterates."""

    Params = FedZOParams

    def client_init(self, client: int) -> FDClient:
        return FDClient()

    def correction(self, x: Tensor, b: ZOBroadcast, state: FDClient) -> Tensor | None:
        """The family's correction term of eq. (2) at local iterate x (None: none)."""
        return None

    def _fd(self, client: int, x: Tensor, fx: Tensor, rng: np.random.Generator) -> Tensor:
        p = self.params
        U = directions(self.dim, p.directions, p.fd_directions, rng)
        scale = unbiased_scale(p.fd_directions) if p.fd_scale == "unbiased" else p.fd_scale
        return fd_gradient(lambda pts: self.query(client, pts, rng), x, fx, U, p.smoothing, scale)

    def local_round(self, state: FDClient, client: int, b: ZOBroadcast, rng: np.random.Generator
                    ) -> tuple[Tensor, Tensor, list[float], int]:
        """T FD steps from the broadcast point: (x_{r,T}, mean uncorrected estimate, cosines, queries)."""
        p = self.params
        x = b.x.clone()
        fx = self.query(client, x[None], rng)[0]
        opt, raw, cosines = self.optimizer(), [], []
        for _ in range(p.local_steps):
            g = self._fd(client, x, fx, rng)
            raw.append(g)
            corr = self.correction(x, b, state)
            g = g if corr is None else g + corr
            if p.track_cosine:
                cosines.append(self.cosine(g, x))
            x = opt.step(x, g)
            fx = self.query(client, x[None], rng)[0]
        return x, torch.stack(raw).mean(0), cosines, 1 + p.local_steps * (p.directions + 1)

    def step(self, cstate: FDClient, data: ClientData, broadcast: ZOBroadcast, rng: np.random.Generator
             ) -> tuple[ZOReply, FDClient, Cost]:
        x, _, cosines, queries = self.local_round(cstate, data.client_id, broadcast, rng)
        return ZOReply(data.client_id, (x,), _cosines(cosines)), cstate, self.cost(queries, self.dim)


def _cosines(values: list[float]) -> Tensor | None:
    return torch.tensor(values, dtype=torch.float64) if values else None


@register_algorithm("zo_fedprox")
class ZOFedProx(FedZO):
    """FedProx in ZO form (eq. (89)): Delta_i(x) + prox (x - x_{r-1}), from round 1."""

    Params = ZOFedProxParams

    def correction(self, x: Tensor, b: ZOBroadcast, state: FDClient) -> Tensor:
        return self.params.prox * (x - b.x)


class _Scaffold(FedZO):
    """SCAFFOLD's correction c - c_i (eq. (91)/(93)); none until both control variates exist."""

    def correction(self, x: Tensor, b: ZOBroadcast, state: FDClient) -> Tensor | None:
        return None if b.shared is None or state.control is None else b.shared - state.control


@register_algorithm("zo_scaffold1")
class ZOScaffold1(_Scaffold):
    """SCAFFOLD Type I (eq. (91)): c_i = Delta_i(x_{r-1}) from a second phase at the new global point."""

    phases = ("local", "control")

    def step(self, cstate: FDClient, data: ClientData, broadcast: ZOBroadcast, rng: np.random.Generator
             ) -> tuple[ZOReply, FDClient, Cost]:
        if broadcast.phase == "local":
            return super().step(cstate, data, broadcast, rng)
        client, x = data.client_id, broadcast.x
        control = self._fd(client, x, self.query(client, x[None], rng)[0], rng)
        return (ZOReply(client, (control,)), FDClient(control),
                self.cost(1 + self.params.directions, self.dim))

    def shared_after(self, phase: str, means: list[Tensor], state: ZOState) -> Tensor | None:
        return means[0] if phase == "control" else state.shared


@register_algorithm("zo_scaffold2")
class ZOScaffold2(_Scaffold):
    """SCAFFOLD Type II (eq. (93)): c_i = mean of the client's uncorrected FD estimates of its last round."""

    def step(self, cstate: FDClient, data: ClientData, broadcast: ZOBroadcast, rng: np.random.Generator
             ) -> tuple[ZOReply, FDClient, Cost]:
        x, control, cosines, queries = self.local_round(cstate, data.client_id, broadcast, rng)
        return (ZOReply(data.client_id, (x, control), _cosines(cosines)), FDClient(control),
                self.cost(queries, 2 * self.dim))

    def shared_after(self, phase: str, means: list[Tensor], state: ZOState) -> Tensor | None:
        return means[1]
