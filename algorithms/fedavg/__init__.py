"""The fedavg family: FedAvg/FedPAQ and FedProx on torch models (the FedLRGD paper), and the server
optimizers FedAvgM, FedAdagrad, FedAdam, FedYogi (server_opt.py).

The local SGD loop itself is the runtime's `raysim.training.LocalSGD`, shared by every family that
trains a torch model; this plugin registers it under the names researchers use.
"""
from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from raysim.algorithms.fedavg.scaffold import Scaffold
from raysim.algorithms.fedavg.server_opt import FedOptState, ServerOpt, ServerOptKind
from raysim.contract import Cost
from raysim.plugins import declare, register_algorithm
from raysim.training import LocalSGD, LocalSGDParams


declare(commands=["raysim.algorithms.fedavg.cli"])


@register_algorithm("fedavg")
class FedAvg(LocalSGD):
    """FedAvg/FedPAQ: partial participation, b local SGD steps, optional QSGD uploads and server lr."""


class FedProxParams(LocalSGDParams):
    """FedProx adds the proximal weight μ ≥ 0 pulling local iterates towards the broadcast."""

    mu: float = Field(0.01, ge=0)


@register_algorithm("fedprox")
class FedProx(FedAvg):
    """FedProx: FedAvg whose local objective adds (μ/2)‖θ − θ_g‖²."""

    Params = FedProxParams

    def __init__(self, ctx):
        super().__init__(ctx)
        self.mu = self.params.mu


class FedAvgMParams(LocalSGDParams):
    """FedAvgM: server momentum β on the pseudo-gradient (Hsu et al. 2019); server_lr is η."""

    server_momentum: float = Field(0.9, ge=0, lt=1, description="β of m_t = β m_{t-1} + Δ_t")


class FedAdaptiveParams(LocalSGDParams):
    """FedAdagrad/FedAdam/FedYogi (Reddi et al. 2021): server_lr is η (tune it: the paper searches a grid),
    β1, β2 and the adaptivity τ (v_{-1} = τ²)."""

    server_lr: float = Field(0.1, gt=0, description="η, the server step")
    server_beta1: float = Field(0.9, ge=0, lt=1)
    server_beta2: float = Field(0.99, gt=0, lt=1, description="unused by FedAdagrad")
    server_tau: float = Field(1e-3, gt=0, description="τ, the adaptivity (and v_{-1} = τ²)")


class _FedOpt(FedAvg):
    """FedAvg's clients; the server steps a `ServerOpt` on the pseudo-gradient instead of adding it."""

    kind: ServerOptKind = "avgm"

    def __init__(self, ctx):
        super().__init__(ctx)
        p = self.params
        self.server_opt = (ServerOpt("avgm", p.server_lr, momentum=p.server_momentum) if self.kind == "avgm" else
                           ServerOpt(self.kind, p.server_lr, beta1=p.server_beta1, beta2=p.server_beta2, tau=p.server_tau))

    def init(self) -> FedOptState:
        base = super().init()
        return replace(self.server_opt.init(base.params), clip=base.clip)

    def aggregate(self, state: FedOptState, replies: list, rng) -> tuple[FedOptState, Cost]:
        if not replies and self.ctx.privacy is None:
            return state, Cost()
        update, clip = self.mean_update(replies, state, rng)
        return replace(self.server_opt.step(state, update), clip=clip), Cost()


@register_algorithm("fedavgm")
class FedAvgM(_FedOpt):
    """FedAvg with server momentum (Hsu et al. 2019)."""

    Params = FedAvgMParams
    kind = "avgm"


@register_algorithm("fedadagrad")
class FedAdagrad(_FedOpt):
    """FedAdagrad (Reddi et al. 2021, Alg. 2)."""

    Params = FedAdaptiveParams
    kind = "adagrad"


@register_algorithm("fedadam")
class FedAdam(_FedOpt):
    """FedAdam (Reddi et al. 2021, Alg. 2)."""

    Params = FedAdaptiveParams
    kind = "adam"


@register_algorithm("fedyogi")
class FedYogi(_FedOpt):
    """FedYogi (Reddi et al. 2021, Alg. 2)."""

    Params = FedAdaptiveParams
    kind = "yogi"


__all__ = ["FedAdagrad", "FedAdam", "FedAvg", "FedAvgM", "FedProx", "FedYogi", "Scaffold"]
