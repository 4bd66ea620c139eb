"""SCAFFOLD with option II control variates (Karimireddy et al. 2020, Algorithm 1) on torch models, vectorized like
FedAvg: the server keeps c, each client its c_i (0 before its first round), and a round is

  client i in S:  y ← y − η_l (g_i(y) − c_i + c) for its K local steps, from y = x
                  c_i⁺ = c_i − c + (x − y) / (K η_l)                         (option II)
                  uploads Δy_i = y − x and Δc_i = c_i⁺ − c_i
  server:         x ← x + η_g Σ w_i Δy_i / Σ w_i,   c ← c + (1/N) Σ_{i∈S} Δc_i

w_i follows `weighting` (samples, or uniform as in the paper); the upload is twice FedAvg's (Δy and Δc), and so
is the download (x and c).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from raysim.contract import Cost, Plan
from raysim.plugins import register_algorithm
from raysim.training import Broadcast, LocalSGD, ServerState
from raysim.core.sampling import sample_clients


@dataclass
class ScaffoldState(ServerState):
    """The global model x and the server control variate c."""

    control: np.ndarray


@dataclass
class ScaffoldBroadcast(Broadcast):
    """x, the round's local lr η_l, and c."""

    control: np.ndarray


@dataclass
class ScaffoldReply:
    """Σ w_i Δy_i, Σ w_i and Σ Δc_i of one client or a pre-reduced group (summing two is a valid reduction)."""

    total: np.ndarray
    weight: float
    control: np.ndarray


@register_algorithm("scaffold")
class Scaffold(LocalSGD):
    """SCAFFOLD (option II)."""

    supports_privacy = False  # its control variates would leak unnoised

    def __init__(self, ctx):
        super().__init__(ctx)
        if self.params.quantizer != "none" or self.params.local_optimizer.kind != "sgd" or self.params.local_optimizer.momentum:
            raise ValueError("algorithm: scaffold's option II control variate assumes plain local SGD steps and exact "
                             "uploads; use quantizer: none and local_optimizer: {kind: sgd, momentum: 0}")

    def init(self) -> ScaffoldState:
        params = super().init().params
        return ScaffoldState(params, np.zeros_like(params))

    def plan(self, state: ScaffoldState, round: int, rng: np.random.Generator) -> Plan:
        clients = sample_clients(self.ctx.num_clients, self.ctx.clients_per_round, rng)
        return Plan(clients, ScaffoldBroadcast(state.params, self.params.step_size(max(round - 1, 0)), state.control))

    def correction(self, cstates: list, broadcast: ScaffoldBroadcast) -> torch.Tensor:
        """c − c_i per client [k, d]."""
        c = torch.as_tensor(broadcast.control, dtype=self.dtype, device=self.device)
        own = torch.stack([torch.zeros_like(c) if ci is None else torch.as_tensor(ci, dtype=self.dtype, device=self.device)
                           for ci in cstates])
        return c[None] - own

    def step(self, cstate, data, broadcast: ScaffoldBroadcast, rng: np.random.Generator):
        return self.step_many([cstate], [data], broadcast, [rng])[0]

    def step_many(self, cstates: list, datas: list, broadcast: ScaffoldBroadcast, rngs: list):
        """FedAvg's vectorized local steps with the correction c − c_i, then option II's c_i⁺ from each client's own K."""
        out = []
        for ci, data, (reply, _, cost) in zip(cstates, datas, super().step_many(cstates, datas, broadcast, rngs)):
            delta = reply.total / reply.weight
            ci = np.zeros_like(delta) if ci is None else ci
            new = ci - broadcast.control - delta / (cost.oracle_batches * broadcast.lr)
            out.append((ScaffoldReply(reply.total, reply.weight, new - ci), new,
                        Cost(oracle_calls=cost.oracle_calls, oracle_batches=cost.oracle_batches,
                             upload_vectors=2 * cost.upload_vectors, upload_bytes=2 * cost.upload_bytes)))
        return out

    def reduce(self, replies: list[ScaffoldReply]) -> ScaffoldReply:
        return ScaffoldReply(np.sum([r.total for r in replies], axis=0), sum(r.weight for r in replies),
                             np.sum([r.control for r in replies], axis=0))

    def aggregate(self, state: ScaffoldState, replies: list[ScaffoldReply], rng) -> tuple[ScaffoldState, Cost]:
        if not replies:
            return state, Cost()
        total = self.reduce(replies)
        return ScaffoldState(state.params + self.params.server_lr * total.total / total.weight,
                             state.control + total.control / self.ctx.num_clients), Cost()
