"""Server optimizers on the round's pseudo-gradient Δ_t = Σ w_c (θ_c − θ_t) / Σ w_c: FedAvgM (Hsu et al. 2019)
and FedAdagrad, FedAdam, FedYogi (Reddi et al. 2021, Algorithm 2: no bias correction, v_{-1} = τ²).

  FedAvgM:  m_t = β m_{t-1} + Δ_t,                               θ_{t+1} = θ_t + η m_t
  adaptive: m_t = β1 m_{t-1} + (1 − β1) Δ_t, and
            Adagrad v_t = v_{t-1} + Δ_t²
            Adam    v_t = β2 v_{t-1} + (1 − β2) Δ_t²
            Yogi    v_t = v_{t-1} − (1 − β2) Δ_t² sign(v_{t-1} − Δ_t²),  θ_{t+1} = θ_t + η m_t / (√v_t + τ)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from raysim.training import ServerState

ServerOptKind = Literal["avgm", "adagrad", "adam", "yogi"]


@dataclass
class FedOptState(ServerState):
    """The global model and the server optimizer's moments (v unused by FedAvgM)."""

    m: np.ndarray
    v: np.ndarray


@dataclass(frozen=True)
class ServerOpt:
    """One server optimizer and its hyperparameters."""

    kind: ServerOptKind
    lr: float
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def init(self, params: np.ndarray) -> FedOptState:
        """m_{-1} = 0 and v_{-1} = τ² (Reddi et al., Alg. 2)."""
        return FedOptState(params, np.zeros_like(params), np.full_like(params, self.tau ** 2))

    def step(self, state: FedOptState, delta: np.ndarray) -> FedOptState:
        """θ_{t+1} and the moments after the pseudo-gradient `delta` (module docstring)."""
        if self.kind == "avgm":
            m = self.momentum * state.m + delta
            return FedOptState(state.params + self.lr * m, m, state.v)
        m = self.beta1 * state.m + (1.0 - self.beta1) * delta
        d2 = delta * delta
        if self.kind == "adagrad":
            v = state.v + d2
        elif self.kind == "adam":
            v = self.beta2 * state.v + (1.0 - self.beta2) * d2
        else:
            v = state.v - (1.0 - self.beta2) * d2 * np.sign(state.v - d2)
        return FedOptState(state.params + self.lr * m / (np.sqrt(v) + self.tau), m, v)
