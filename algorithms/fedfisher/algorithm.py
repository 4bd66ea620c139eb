"""FedFisher (Jhunjhunwala, Wang & Joshi, AISTATS 2024; the FedFisher paper): one-shot FL with
the clients' Fisher information.

Each client trains E epochs from W0 and uploads (W_i, F_i) with F_i its diagonal true Fisher
(`fisher: diag`) or its K-FAC factors (`fisher: kfac`; parameters outside Linear/Conv layers get a diagonal
block (README); the Fisher is taken in eval mode, BatchNorm on its running statistics), compressed as App. C when
`compression` is not `none` (App. C: quantized weights and Fisher, low-rank K-FAC factors; Cost counts the bits). The server minimizes
Φ(W) = ½ Σ p_i (W − W_i)^T F_i (W − W_i) from W̄ = Σ p_i W_i with the code's Adam variant (lr 0.01,
betas 0.9/0.99, ε 0.01, 2000 steps) and returns the best iterate on the 500-sample validation set
every 100 steps (App. D.3). `rounds > 1` is the few-shot extension of Fig. 2 (Sec. 5.2).
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from raysim.algorithms.fedfisher.baselines import FisherStatsParams, LocalModel, OneShot
from raysim.algorithms.fedfisher.fisher import KFAC, FisherEstimate, FisherType, diagonal_fisher, fisher_partition, kfac_fisher
from raysim.algorithms.fedfisher.fisher.compress import CompressionKind, Compression
from raysim.contract import ClientData, Cost
from raysim.algorithms.fedfisher.merge.average import weighted_average
from raysim.algorithms.fedfisher.merge.fedfisher import DiagObjective, KFACObjective, OptimizerKind, ServerOptimizer, solve
from raysim.errors import ConfigError
from raysim.plugins import register_algorithm


class FedFisherParams(FisherStatsParams):
    """The Fisher variant and the server solver of App. D.3 (defaults: the paper's code)."""

    fisher: Literal["diag", "kfac"] = "diag"
    fisher_type: FisherType = Field("true_exact", description="true_exact (eq. (3), the code's), true_mc or empirical")
    fisher_mc_samples: int = Field(1, ge=1, description="labels drawn per sample for true_mc")
    compression: CompressionKind = Field("none", description="none, paper (App. C as the code runs it) or explicit")
    s_q: float = Field(4.0, ge=1, le=32, description="explicit: the Fisher is quantized to floor(32/s_q) bits")
    s_v: float = Field(1.0, ge=1, description="explicit: K-FAC factors of dim m keep floor(m/(2 s_v)) triplets; 1: no SVD")
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

    def __init__(self, ctx):
        super().__init__(ctx)
        try:  # a convolution the Fisher does not cover fails here, before any client trains
            fisher_partition(self.module)
        except ValueError as e:
            raise ConfigError(f"model.name: {e}") from None
        p = self.params
        self.compression = Compression(p.compression, p.s_q, p.s_v)

    def fisher_stats(self, module: torch.nn.Module, data: ClientData, rng: np.random.Generator):
        """The client's Fisher (diagonal vector or KFAC), its float count and Cost: one pass over the local data
        with K backward passes per batch (K = C classes, k Monte Carlo labels, or 1; eq. (3))."""
        p = self.params
        gen = torch.Generator().manual_seed(int(rng.integers(2**62))) if p.fisher_type == "true_mc" else None
        estimate = FisherEstimate(p.fisher_type, p.fisher_mc_samples, gen)
        compute = diagonal_fisher if p.fisher == "diag" else kfac_fisher
        stats = compute(module, data.x, p.fisher_batch_size, estimate, data.y)
        outputs = {"true_exact": self.ctx.num_classes, "true_mc": min(p.fisher_mc_samples, self.ctx.num_classes), "empirical": 1}[p.fisher_type]
        floats = stats.floats if isinstance(stats, KFAC) else stats.size
        batches = -(-len(data) // p.fisher_batch_size)
        return stats, floats, Cost(oracle_calls=len(data) * outputs, oracle_batches=batches)

    def step(self, cstate, data: ClientData, broadcast: np.ndarray, rng: np.random.Generator):
        """Local training, the Fisher, then the upload (W_i, F_i), compressed if asked; its bits go in Cost
        (upload_vectors in model-sized vectors of the model's float width: 32d bits for float32, App. C)."""
        module, cost = self.local_train(data, broadcast, rng)
        params = torch.nn.utils.parameters_to_vector(module.parameters()).detach().cpu().numpy()
        stats, floats, extra = self.fisher_stats(module, data, rng)
        bits = (params.size + floats) * params.itemsize * 8
        if self.compression.kind != "none":
            sent, stats, bits = self.compression.apply(params, stats, self.spec)
            params = sent.astype(params.dtype)
        cost = Cost(oracle_calls=cost.oracle_calls + extra.oracle_calls,
                    oracle_batches=cost.oracle_batches + extra.oracle_batches,
                    upload_vectors=bits / (params.size * params.itemsize * 8), upload_bytes=math.ceil(bits / 8))
        return LocalModel(params, len(data), stats), None, cost

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
