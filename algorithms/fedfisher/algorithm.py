"""FedFisher (Jhunjhunwala, Wang & Joshi, AISTATS 2024; specs/fedfisher.md §2): one-shot FL with
the clients' Fisher information.

Each client trains E epochs from W0 and uploads (W_i, F_i) with F_i its diagonal true Fisher
(`fisher: diag`) or its K-FAC factors (`fisher: kfac`). The server minimizes
Φ(W) = ½ Σ p_i (W − W_i)^T F_i (W − W_i) from W̄ = Σ p_i W_i with the code's Adam variant (lr 0.01,
betas 0.9/0.99, ε 0.01, 2000 steps) and returns the best iterate on the 500-sample validation set
every 100 steps (§2.6). `rounds > 1` is the few-shot extension of Fig. 2 (§8.10).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from raysim.algorithms.fedfisher.baselines import FisherStatsParams, OneShot, diag_stats
from raysim.contract import Cost
from raysim.algorithms.fedfisher.fisher import kfac_fisher
from raysim.algorithms.fedfisher.merge.average import weighted_average
from raysim.algorithms.fedfisher.merge.fedfisher import DiagObjective, KFACObjective, OptimizerKind, ServerOptimizer, solve
from raysim.plugins import register_algorithm


class FedFisherParams(FisherStatsParams):
    """The Fisher variant and the server solver of spec §2.6 (defaults: the paper's code)."""

    fisher: Literal["diag", "kfac"] = "diag"
    server_opt: OptimizerKind = Field("fedfisher_adam", description="fedfisher_adam (the code's), adam or gd")
    server_lr: float = Field(0.01, gt=0)
    server_betas: tuple[float, float] = (0.9, 0.99)
    server_eps: float = Field(0.01, gt=0)
    server_steps: int = Field(2000, ge=1)
    val_every: int = Field(100, ge=1, description="validate after steps k with k % val_every == 0")


@register_algorithm("fedfisher")
class FedFisher(OneShot):
    """FedFisher(Diag) and FedFisher(K-FAC)."""

    Params = FedFisherParams

    def client_stats(self, module, data):
        if self.params.fisher == "diag":
            return diag_stats(self, module, data)
        kfac = kfac_fisher(module, data.x, self.params.fisher_batch_size)
        batches = -(-len(data) // self.params.fisher_batch_size)
        return kfac, kfac.floats, Cost(oracle_calls=len(data) * self.ctx.num_classes, oracle_batches=batches)

    def objective(self, models: np.ndarray, replies: list, weights: np.ndarray) -> DiagObjective | KFACObjective:
        fishers = [r.stats for r in replies]
        if self.params.fisher == "diag":
            return DiagObjective(models, np.stack(fishers), weights, self.dtype)
        return KFACObjective(models, fishers, weights, self.spec, self.dtype)

    def merge(self, models, replies, weights):
        p = self.params
        opt = ServerOptimizer(p.server_opt, p.server_lr, tuple(p.server_betas), p.server_eps)
        score = self.val_accuracy if self.validation is not None else None
        res = solve(self.objective(models, replies, weights), weighted_average(models, weights), p.server_steps, opt,
                    score, p.val_every)
        queries = len(res.scores) * (len(self.validation[1]) if score else 0)
        return res.w, Cost(oracle_calls=queries, oracle_batches=p.server_steps)
