"""One-shot FL (the FedFisher paper): every client trains once from the broadcast
W0 and uploads its model (plus statistics); the server merges the uploads in `aggregate`.

`OneShot` is the shared protocol: E epochs of SGD with momentum (lr 0.01, momentum 0.9, batch
64, shuffled each epoch, deterministic from the client's rng), all M clients every round, client
weights p_i = n_i/N, a 500-sample server validation set drawn with replacement from the pooled
training data. `rounds > 1` repeats it from the merged model (the few-shot extension, Sec. 5.2).
The baselines here: one-shot FedAvg, FisherMerge, RegMean, OTFusion, PFNM and DENSE (their math in
`merge/`, `otfusion.py` and `dense.py`); FedFisher in `algorithm.py`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch.func import functional_call

from raysim.algorithms.fedfisher.dense import Generator, distill, synthesize
from raysim.algorithms.fedfisher.fisher import curvature_layers, diagonal_fisher
from raysim.algorithms.fedfisher.merge.average import client_weights, weighted_average
from raysim.algorithms.fedfisher.merge.fisher_merge import fisher_merge
from raysim.algorithms.fedfisher.merge.pfnm import PFNMPrior, pfnm, widen
from raysim.algorithms.fedfisher.merge.regmean import input_grams, linear_layers, regmean
from raysim.algorithms.fedfisher.otfusion import flag_grid
from raysim.contract import Algorithm, ClientData, Cost, EvalData, Plan
from raysim.core.rng import SERVER, SETUP, stream
from raysim.errors import ConfigError
from raysim.models import ParamSpec, initial_vector, placed_model
from raysim.plugins import register_algorithm
from raysim.training import ServerState, batch_plan


class OneShotParams(BaseModel):
    """Local training of every one-shot method (Sec. 5.1) and the server's validation set (App. D.3)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.01, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    local_epochs: int = Field(30, ge=1)
    batch_size: int = Field(64, ge=1)
    server_val_size: int = Field(500, ge=0, description="validation samples drawn with replacement; 0: no selection")


@dataclass
class LocalModel:
    """A client's upload: its trained flat parameter vector, its sample count and its statistics."""

    params: np.ndarray
    n: int
    stats: Any = None


class OneShot(Algorithm):
    """The shared one-shot protocol; subclasses define `client_stats` and `merge`. The state hooks take the
    contract's Any: a subclass may keep more than the merged vector (PFNM's widened model)."""

    Params: ClassVar[type[BaseModel] | None] = OneShotParams

    def __init__(self, ctx):
        super().__init__(ctx)
        self.module, self.spec, self.dtype, self.device = placed_model(ctx)
        if ctx.clients_per_round != ctx.num_clients:
            raise ConfigError(f"algorithm.clients_per_round: one-shot methods take every client each round; "
                             f"set it to data.num_clients={ctx.num_clients} (got {ctx.clients_per_round})")

    def init(self) -> ServerState:
        """W0: PyTorch's default initialization under the experiment seed."""
        c = self.ctx
        return ServerState(initial_vector(c.model, c.feature_shape, c.image_shape, c.num_classes, c.seed))

    def plan(self, state: Any, round: int, rng: np.random.Generator) -> Plan:
        return Plan(np.arange(self.ctx.num_clients), state.params)

    def evaluate(self, state: Any, data: EvalData) -> dict[str, float]:
        """Top-1 test accuracy and cross-entropy of the merged model; the loss on pooled training data."""
        params = self.spec.unflatten(torch.as_tensor(state.params, dtype=self.dtype, device=self.device))
        return self.metrics(lambda x: functional_call(self.module, params, (x,)), data)

    def export(self, state: Any) -> torch.nn.Module:
        """The merged model (on the CPU)."""
        return self.spec.module_with(self.module, state.params, self.dtype)

    def metrics(self, forward, data: EvalData) -> dict[str, float]:
        """`evaluate`'s metrics of the network `forward` (a callable on a batch of inputs)."""
        with torch.no_grad():
            out, train = forward(data.test_x.to(self.device)), forward(data.train_x.to(self.device))
        test_y, train_y = data.test_y.to(self.device), data.train_y.to(self.device)
        return {"test_accuracy": float((out.argmax(1) == test_y).double().mean()),
                "test_loss": float(F.cross_entropy(out, test_y)), "train_loss": float(F.cross_entropy(train, train_y))}

    def _module_at(self, flat: np.ndarray | torch.Tensor) -> torch.nn.Module:
        """A copy of the model whose parameters are a copy of `flat` (never a view of the broadcast)."""
        module = copy.deepcopy(self.module)
        torch.nn.utils.vector_to_parameters(torch.tensor(flat, dtype=self.dtype, device=self.device),
                                            module.parameters())
        return module

    def local_train(self, data: ClientData, w0: np.ndarray, rng: np.random.Generator) -> tuple[torch.nn.Module, Cost]:
        """E epochs of minibatch SGD with momentum from w0 (Sec. 5.1); the Cost of the training alone."""
        p = self.params
        module = self._module_at(w0)
        opt = torch.optim.SGD(module.parameters(), lr=p.lr, momentum=p.momentum)
        bp = batch_plan(len(data), p.batch_size, None, p.local_epochs, rng)
        idx = torch.from_numpy(bp.idx).to(self.device)
        sizes = bp.w.sum(1).astype(np.int64)
        for s in range(len(idx)):
            b = idx[s, : sizes[s]]
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(module(data.x[b]), data.y[b]).backward()
            opt.step()
        return module, Cost(oracle_calls=int(sizes.sum()), oracle_batches=len(idx))

    def client_stats(self, module: torch.nn.Module, data: ClientData) -> tuple[Any, int, Cost]:
        """What the client sends besides its model: (stats, floats, extra Cost). None for FedAvg."""
        return None, 0, Cost()

    def step(self, cstate, data: ClientData, broadcast: np.ndarray, rng: np.random.Generator):
        module, cost = self.local_train(data, broadcast, rng)
        params = torch.nn.utils.parameters_to_vector(module.parameters()).detach().cpu().numpy()
        stats, floats, extra = self.client_stats(module, data)
        itemsize = params.itemsize
        total = params.size + floats
        cost = Cost(oracle_calls=cost.oracle_calls + extra.oracle_calls,
                    oracle_batches=cost.oracle_batches + extra.oracle_batches,
                    upload_vectors=total / params.size, upload_bytes=total * itemsize)
        return LocalModel(params, len(data), stats), None, cost

    def merge(self, models: np.ndarray, replies: list[LocalModel], weights: np.ndarray) -> tuple[np.ndarray, Cost]:
        """The merged flat vector and the server's Cost."""
        raise NotImplementedError

    def aggregate(self, state: Any, replies: list[LocalModel], rng: np.random.Generator) -> tuple[Any, Cost]:
        if not replies:
            return state, Cost()
        models = np.stack([r.params for r in replies])
        merged, cost = self.merge(models, replies, client_weights([r.n for r in replies]))
        return ServerState(np.asarray(merged, dtype=state.params.dtype)), cost

    @cached_property
    def validation(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The server's validation set: `server_val_size` pooled training samples drawn with replacement."""
        if self.params.server_val_size == 0 or self.ctx.train_path is None:
            return None
        from raysim.data import read_table_arrays

        x, y = read_table_arrays(self.ctx.train_path)
        pick = stream(self.ctx.data_seed, SETUP, SERVER, "oneshot_validation").choice(len(y), self.params.server_val_size)
        return torch.tensor(x[pick], dtype=self.dtype, device=self.device), torch.tensor(y[pick], device=self.device)

    def val_accuracy(self, flat: np.ndarray) -> float:
        """Accuracy of the flat parameter vector on the validation set."""
        validation = self.validation
        assert validation is not None, "val_accuracy needs a validation set (server_val_size > 0)"
        x, y = validation
        params = self.spec.unflatten(torch.as_tensor(flat, dtype=self.dtype, device=self.device))
        with torch.no_grad():
            return float((functional_call(self.module, params, (x,)).argmax(1) == y).double().mean())

    def select(self, candidates: list[np.ndarray]) -> tuple[int, Cost]:
        """Index of the candidate best on validation (the first without a validation set), and its Cost."""
        if self.validation is None or len(candidates) == 1:
            return 0, Cost()
        scores = [self.val_accuracy(c) for c in candidates]
        return int(np.argmax(scores)), Cost(oracle_calls=len(candidates) * len(self.validation[1]))


@register_algorithm("oneshot_fedavg")
class OneShotFedAvg(OneShot):
    """One-shot FedAvg: W = Σ p_i W_i (Sec. 5.1, the code's weights)."""

    def merge(self, models, replies, weights):
        return weighted_average(models, weights), Cost()


class FisherStatsParams(OneShotParams):
    """Methods whose clients also send a Fisher computed over all local samples in batches."""

    fisher_batch_size: int = Field(64, ge=1)


class FisherMergeParams(FisherStatsParams):
    floor: float = Field(1e-6, ge=0, description="FedAvg fallback where Σ p_i F_i <= floor")


def diag_stats(algo: OneShot, module: torch.nn.Module, data: ClientData) -> tuple[np.ndarray, int, Cost]:
    """The client's diagonal true Fisher: one pass with C per-class backward passes (eq. (3))."""
    diag = diagonal_fisher(module, data.x, algo.params.fisher_batch_size)
    batches = -(-len(data) // algo.params.fisher_batch_size)
    return diag, diag.size, Cost(oracle_calls=len(data) * algo.ctx.num_classes, oracle_batches=batches)


@register_algorithm("fisher_merge")
class FisherMerge(OneShot):
    """FisherMerge with the diagonal true Fisher and the code's FedAvg fallback (App. D.3)."""

    Params = FisherMergeParams

    def client_stats(self, module, data):
        return diag_stats(self, module, data)

    def merge(self, models, replies, weights):
        return fisher_merge(models, np.stack([r.stats for r in replies]), weights, self.params.floor), Cost()


class RegMeanParams(OneShotParams):
    alphas: list[float] = Field(default_factory=lambda: [0.1, 0.9], min_length=1,
                                description="off-diagonal scalings tried; the best on validation is kept")
    gram_batch_size: int = Field(16, ge=1)
    gram_batches: int = Field(1000, ge=1)
    others: Literal["uniform", "samples"] = Field("uniform", description="weights of the non-Linear average (code: uniform)")


@register_algorithm("regmean")
class RegMean(OneShot):
    """RegMean on the Linear layers, averaging the rest (App. D.3)."""

    Params = RegMeanParams

    def client_stats(self, module, data):
        p = self.params
        grams = input_grams(module, data.x, p.gram_batch_size, p.gram_batches)
        n = min(len(data), p.gram_batch_size * p.gram_batches)
        return grams, sum(g.size for g in grams), Cost(oracle_calls=n, oracle_batches=-(-n // p.gram_batch_size))

    def merge(self, models, replies, weights):
        layers = linear_layers(self.module)
        grams = [r.stats for r in replies]
        candidates = [regmean(models, grams, weights, layers, self.spec, a, self.params.others) for a in self.params.alphas]
        best, cost = self.select(candidates)
        return candidates[best], cost


@register_algorithm("otfusion")
class OTFusion(OneShot):
    """OTFusion: every layer transported onto client 0's by exact OT on the weights, then averaged; the code's
    `correction` and `past_correction` flags are chosen on validation (App. D.3)."""

    def merge(self, models, replies, weights):
        candidates = list(flag_grid(models, weights, self.spec, curvature_layers(self.module)))
        best, cost = self.select(candidates)
        return candidates[best], cost


class PFNMParams(OneShotParams):
    """PFNM's BBP prior and MAP search; defaults are the reference code's (App. D.3)."""

    sigma: float = Field(1.0, gt=0, description="variance of a local neuron around its global atom")
    sigma0: float = Field(1.0, gt=0, description="prior variance of a global atom")
    gamma: float = Field(7.0, gt=0, description="mass of the Beta-Bernoulli process (new-neuron propensity)")
    iterations: int = Field(5, ge=0, description="random-order matching sweeps after the first pass")
    max_global_width: int = Field(700, ge=1,
                                  description="new atoms offered to a client: max(this - L, 1), or enough to place all")


@dataclass
class PFNMState(ServerState):
    """The global model and its hidden widths (None: the local architecture, before the merge)."""

    widths: tuple[int, ...] | None = None


@register_algorithm("pfnm")
class PFNM(OneShot):
    """PFNM: layer-wise BBP-MAP neuron matching; the global model may be wider than the local ones (App. D.3, Sec. 5.2).
    Clients also send their class counts (C numbers) for the output layer's averaging weights."""

    Params = PFNMParams

    def __init__(self, ctx):
        super().__init__(ctx)
        if ctx.rounds != 1:
            raise ConfigError(f"algorithm.rounds: PFNM is one-shot only (its merged model has another architecture "
                             f"and the paper omits it from few-shot runs, Sec. 5.2); set rounds: 1 (got {ctx.rounds})")

    def init(self) -> PFNMState:
        return PFNMState(super().init().params)

    def client_stats(self, module, data):
        counts = np.bincount(data.y.cpu().numpy(), minlength=self.ctx.num_classes)
        return counts, counts.size, Cost()

    def aggregate(self, state, replies, rng):
        if not replies:
            return state, Cost()
        p = self.params
        prior = PFNMPrior(p.sigma, p.sigma0, p.gamma, p.iterations, p.max_global_width)
        params, widths = pfnm(np.stack([r.params for r in replies]), np.stack([r.stats for r in replies]),
                              client_weights([r.n for r in replies]), self.module, prior, rng)
        return PFNMState(params.astype(state.params.dtype), widths), Cost()

    def evaluate(self, state: PFNMState, data: EvalData) -> dict[str, float]:
        """The metrics of `OneShot.evaluate` on the widened model, and its hidden widths."""
        if state.widths is None:
            return super().evaluate(state, data)
        module = widen(self.module, state.widths)
        torch.nn.utils.vector_to_parameters(torch.as_tensor(state.params, dtype=self.dtype, device=self.device),
                                            module.parameters())
        return {**self.metrics(module, data), **{f"pfnm_width_{k}": float(w) for k, w in enumerate(state.widths)}}

    def export(self, state: PFNMState) -> torch.nn.Module:
        """The merged model, widened to the global hidden widths (on the CPU)."""
        if state.widths is None:
            return super().export(state)
        module = widen(self.module, state.widths)
        return ParamSpec.of(module).module_with(module, state.params, self.dtype)


class DENSEParams(OneShotParams):
    """DENSE's synthesis and distillation; defaults are the paper code's (App. D.3)."""

    nz: int = Field(256, ge=1, description="latent size of the generator")
    ngf: int = Field(64, ge=1, description="generator width (channels of its last hidden block)")
    epochs: int = Field(20, ge=1, description="synthesis + distillation epochs; the best on validation is kept")
    gen_iterations: int = Field(30, ge=1, description="Adam steps on (generator, z) per epoch (T_G)")
    gen_lr: float = Field(1e-3, gt=0)
    synthesis_batch_size: int = Field(256, ge=1)
    sample_batch_size: int = Field(256, ge=1, description="distillation minibatch over the image pool")
    oh: float = Field(1.0, ge=0, description="weight of the ensemble's cross-entropy to random targets (lambda_1)")
    adv: float = Field(0.5, ge=0, description="weight of the adversarial (disagreement) term (lambda_2)")
    temperature: float = Field(20.0, gt=0, description="distillation temperature")
    distill_lr: float = Field(0.01, gt=0)
    distill_momentum: float = Field(0.9, ge=0, lt=1)


@register_algorithm("dense")
class DENSE(OneShot):
    """DENSE: the student, started at FedAvg, is distilled from the p-weighted logit ensemble of the local models on
    generator-synthesized images; the epoch best on validation is returned (App. D.3)."""

    Params = DENSEParams

    def __init__(self, ctx):
        super().__init__(ctx)
        if ctx.image_shape is None:
            raise ValueError("model: DENSE synthesizes images; it needs a data source with an image shape")
        if any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in self.module.modules()):
            raise ValueError("model: DENSE's BatchNorm-statistics loss is not built; use a model without BatchNorm")

    def aggregate(self, state, replies, rng):
        if not replies:
            return state, Cost()
        p, c = self.params, self.ctx
        weights = client_weights([r.n for r in replies])
        locals_ = [self.spec.unflatten(torch.as_tensor(r.params, dtype=self.dtype, device=self.device)) for r in replies]

        def teacher(x: torch.Tensor) -> torch.Tensor:
            return sum(float(w) * functional_call(self.module, m, (x,)) for w, m in zip(weights, locals_))

        student = self._module_at(weighted_average(np.stack([r.params for r in replies]), weights))
        generator = Generator(p.nz, p.ngf, tuple(c.image_shape)).to(self.device, self.dtype)
        opt = torch.optim.SGD(student.parameters(), lr=p.distill_lr, momentum=p.distill_momentum)
        g = torch.Generator().manual_seed(int(rng.integers(2**62)))
        pool, candidates, steps = [], [], 0
        for _ in range(p.epochs):
            pool.append(synthesize(teacher, student, generator, p.nz, c.num_classes, p.synthesis_batch_size,
                                   p.gen_iterations, p.gen_lr, p.oh, p.adv, g))
            steps += p.gen_iterations + distill(student, teacher, torch.cat(pool), opt, p.sample_batch_size,
                                                p.temperature, g)
            candidates.append(torch.nn.utils.parameters_to_vector(student.parameters()).detach().cpu().numpy())
        best, cost = self.select(candidates) if self.validation is not None else (len(candidates) - 1, Cost())
        merged = np.asarray(candidates[best], dtype=state.params.dtype)
        return ServerState(merged), Cost(oracle_calls=cost.oracle_calls, oracle_batches=steps)
