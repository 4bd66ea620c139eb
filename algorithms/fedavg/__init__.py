"""The fedavg family: FedAvg/FedPAQ and FedProx on torch models (specs/fedlrgd.md §4.1).

The local SGD loop itself is the runtime's `raysim.training.LocalSGD`, shared by every family that
trains a torch model; this plugin registers it under the names researchers use.
"""
from __future__ import annotations

from pydantic import Field

from raysim.plugins import register_algorithm
from raysim.training import LocalSGD, LocalSGDParams


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
