"""Local SGD on torch models, the training loop every model-training family shares: FedAvg in the
FedPAQ form (the FedLRGD paper), which families register under their own names and extend.

A round k: the server samples clients and broadcasts θ_k and the round's step size η_k; each
client runs local SGD steps θ ← θ − η_k·(∇f_c(θ) + μ(θ − θ_g)) (μ = 0 is FedAvg) and uploads its
weighted delta Q(θ_c − θ_k) (Q the identity, or FedPAQ's unbiased QSGD quantizer); the server
applies θ ← θ + server_lr · Σ w_c Q(Δ_c) / Σ w_c. The loss is cross-entropy (class labels or soft
class distributions), the soft-label logistic loss (66) of a scalar output, or squared error, plus
(l2/2)‖θ‖² per sample. η_k is constant or FedPAQ's decaying 4/(μ((k + T0) b + 1)) (algorithms/fedlrgd/README.md).
A shard runs its clients at once over stacked parameter vectors (raysim.training.stacked's batched matmuls for
chains of linear layers, raysim.training.vmapped's vmapped forward for other models); `step` is the per-client
reference, one client through the same kernels.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch.func import functional_call

from raysim.contract import Algorithm, ClientBatch, ClientData, Cost, Costs, EvalData, Plan, Steps
from raysim.core import compiled
from raysim.core.device import host
from raysim.core.keys import Keys
from raysim.core.privacy import calibrated_noise, epsilon_after
from raysim.core.summary import summary_names
from raysim.errors import ConfigError
from raysim.models import initial_vector, placed_model
from raysim.training.local_optim import LocalOptimizer
from raysim.core.sampling import sample_clients
from raysim.training.stacked import stacked_grad
from raysim.training.vmapped import VmappedGrad


LossKind = Literal["ce", "bce", "mse"]


def sample_losses(out: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-sample losses of outputs `out` (B, k): `ce` cross-entropy with class labels or soft class
    distributions; `bce` the soft-label logistic loss (66) y·log(1+e^{−z}) + (1−y)·log(1+e^{z}) of a
    scalar output z; `mse` ½‖out − y‖² (integer labels as one-hot)."""
    if y.is_floating_point():
        y = y.to(out.dtype)
    if kind == "ce" and not y.is_floating_point():
        return label_cross_entropy(out, y)
    if kind == "ce":
        return F.cross_entropy(out, y, reduction="none")
    if kind == "bce":
        return F.binary_cross_entropy_with_logits(out.reshape(y.shape), y, reduction="none")
    target = y.reshape(out.shape) if y.is_floating_point() else one_hot(y, out.shape[-1], out.dtype)
    return 0.5 * ((out - target) ** 2).reshape(len(out), -1).sum(1)


def loss_problem(kind: str, num_classes: int, target_shape: tuple) -> str | None:
    """Why the loss `kind` cannot train on targets of `num_classes` classes (0: real or soft targets) and per-sample
    shape `target_shape`, or None: bce takes one output and labels in [0, 1], ce class labels or distributions."""
    if kind == "bce" and num_classes > 1:
        return (f"algorithm.loss: 'bce' is the logistic loss (66) of one output and labels in [0, 1], but the data have"
                f" {num_classes} classes; use 'ce' (or 'mse' on one-hot targets)")
    if kind == "ce" and num_classes == 0 and not target_shape:
        return ("algorithm.loss: 'ce' needs class labels or class distributions, but the data's targets are real"
                " scalars; use 'bce' (labels in [0, 1]) or 'mse'")
    return None


def one_hot(y: torch.Tensor, k: int, dtype: torch.dtype) -> torch.Tensor:
    """Class labels `y` as rows of k zeros and a one, in `dtype`: compared with the classes, not `F.one_hot`, which
    reads the labels' maximum (a data-dependent `.item()` that vmap refuses)."""
    return (y.unsqueeze(-1) == torch.arange(k, device=y.device)).to(dtype)


def label_cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy log Σ_j exp z_j − z_y of logits `out` (B, k) and class labels `y`, reduced over the
    classes along the outer axis of the transposed logits: on a CPU with few classes, forward and backward take a
    quarter of log_softmax's time over the k-wide inner axis (equal within float rounding)."""
    zt = out.transpose(-1, -2)
    top = zt.amax(-2).detach()  # amax: max without the indices, three times faster
    return (zt - top.unsqueeze(-2)).exp().sum(-2).log() + top - label_logits(out, y)


def label_logits(out: torch.Tensor, y: torch.Tensor, masked: bool | None = None) -> torch.Tensor:
    """z_y of logits `out` (B, k): gathered on a CPU; summed over the row masked to class y elsewhere (`masked`, by
    default off the CPU), where a gather's backward, a scatter, is a sort under deterministic algorithms. The same
    bits both ways, and the same gradient (a masked copy of the incoming one, as the scatter writes it)."""
    if out.device.type != "cpu" if masked is None else masked:
        return torch.where(one_hot(y, out.shape[-1], torch.bool), out, 0.0).sum(-1)
    return out.gather(-1, y.unsqueeze(-1)).squeeze(-1)


EVAL_CHUNK_ROWS = 1 << 15  # logits a chunk at a time: its temporaries stay in cache
CLIENT_EVAL_ROWS = 32  # a client's rows a matrix of federated evaluation (the last one padded)
CLIENT_EVAL_GROUP = 256  # such matrices a stacked forward at a time


def class_metrics(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-sample cross-entropy, predicted class) of logits `out` (B, k) and class labels `y`, from one
    max over the classes: log Σ exp(z − m) + m − z_y. Four times faster than `F.cross_entropy` on a
    few classes (its log-softmax writes all B·k values), equal to it within float rounding."""
    losses = out.new_empty(len(out))
    pred = torch.empty(len(out), dtype=torch.long, device=out.device)
    for a in range(0, len(out), EVAL_CHUNK_ROWS):
        z, b = out[a:a + EVAL_CHUNK_ROWS], a + EVAL_CHUNK_ROWS
        top, pred[a:b] = z.max(1)  # the first maximal class, as argmax
        losses[a:b] = (z - top[:, None]).exp_().sum(1).log_().add_(top).sub_(z.gather(1, y[a:b, None]).squeeze(1))
    return losses, pred


def _spread(values: np.ndarray, at: np.ndarray, n: int) -> np.ndarray:
    """`values` placed at positions `at` of n, NaN elsewhere."""
    out = np.full(n, np.nan)
    out[at] = values
    return out


def squared_norm(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """‖θ‖² of named parameters."""
    return cast(torch.Tensor, sum((p * p).sum() for p in params.values()))  # never empty: not sum's start 0


def qsgd_rows(v: np.ndarray, levels: int, u: np.ndarray) -> np.ndarray:
    """QSGD's unbiased stochastic quantizer with `levels` = s levels (FedPAQ, ref. [30] of the FedLRGD paper), of every
    row of v [k, d] with uniforms u [k, d]: Q(v)_i = ‖v‖ sign(v_i) ξ_i, ξ_i = (l+1)/s with probability
    s|v_i|/‖v‖ − l, else l/s, l = ⌊s|v_i|/‖v‖⌋; a zero row stays zero."""
    norm = np.sqrt(np.einsum("kd,kd->k", v, v, dtype=np.float64))[:, None]
    scaled = np.abs(v) * np.divide(levels, norm, out=np.zeros_like(norm), where=norm > 0)
    low = np.floor(scaled)
    xi = (low + (u < scaled - low)) / levels
    return (norm * np.sign(v) * xi).astype(v.dtype)


def qsgd(v: np.ndarray, levels: int, rng: np.random.Generator) -> np.ndarray:
    """`qsgd_rows` of one vector, its uniforms drawn from `rng`."""
    return qsgd_rows(v[None], levels, rng.random((1, v.size)))[0]


def qsgd_bytes(p: int, levels: int) -> int:
    """Bytes of one QSGD-encoded p-vector: a float32 norm, then per coordinate a sign bit and a level index."""
    return math.ceil((32 + p * (1 + math.ceil(math.log2(levels + 1)))) / 8)


class LocalSGDParams(BaseModel):
    """Hyperparameters of FedAvg/FedPAQ: local SGD steps (or epochs) of a minibatch size, the loss,
    the step-size schedule and the upload quantizer."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.05, gt=0, description="the constant step size (lr_schedule: constant)")
    local_steps: int | None = Field(None, ge=1)
    local_epochs: int | None = Field(None, ge=1)
    batch_size: int | None = Field(10, ge=1, description="None: full local batch")
    server_lr: float = Field(1.0, gt=0)
    weighting: Literal["samples", "uniform"] = "samples"
    theta0: Literal["model_init", "zeros"] = Field("model_init", description="the initial global model")
    loss: LossKind = Field("ce", description="ce (labels or soft classes), bce (soft-label logistic (66)), mse")
    l2: float = Field(0.0, ge=0, description="per-sample regularizer (l2/2)‖θ‖²")
    lr_schedule: Literal["constant", "fedpaq", "fedpaq_capped"] = Field(
        "constant", description="constant lr; fedpaq 4/(μ((k+T0)b+1)); fedpaq_capped min(1/L1, 4/(μ(kb+1)))")
    strong_convexity: float | None = Field(None, gt=0, description="μ of the fedpaq schedules; None: l2")
    L1: float | None = Field(None, gt=0, description="smoothness of the fedpaq schedules (T0 = 4κ, the cap 1/L1)")
    t0: float | None = Field(None, ge=0, description="shift T0 of the fedpaq schedule; None: 4κ = 4 L1/μ")
    local_optimizer: LocalOptimizer = Field(default_factory=LocalOptimizer,
                                            description="{kind: sgd | adam, momentum, weight_decay, betas, eps}")
    quantizer: Literal["none", "qsgd"] = Field("none", description="upload Q(Δ): identity or unbiased QSGD")
    levels: int = Field(1, ge=1, description="QSGD levels s")

    @model_validator(mode="after")
    def _one_length(self):
        if self.local_steps is not None and self.local_epochs is not None:
            raise ValueError("set either local_steps or local_epochs, not both")
        if self.local_steps is None and self.local_epochs is None:
            self.local_steps = 10
        if self.lr_schedule != "constant":
            if self.local_steps is None:
                raise ValueError(f"lr_schedule {self.lr_schedule!r} needs local_steps (b), not local_epochs")
            if self.strong_convexity is None and self.l2 == 0:
                raise ValueError(f"lr_schedule {self.lr_schedule!r} needs strong_convexity (or l2 > 0) for μ")
            if self.L1 is None and (self.lr_schedule == "fedpaq_capped" or self.t0 is None):
                raise ValueError(f"lr_schedule {self.lr_schedule!r} needs L1" +
                                 (" (or t0)" if self.lr_schedule == "fedpaq" else ""))
        return self

    def step_size(self, k: int) -> float:
        """η_k of round k = 0, 1, ... (FedPAQ's schedule is constant within a round)."""
        if self.lr_schedule == "constant":
            return self.lr
        mu, b = self.strong_convexity or self.l2, self.local_steps
        assert b is not None  # _one_length: a schedule needs local_steps
        if self.lr_schedule == "fedpaq":
            if self.t0 is not None:
                t0 = self.t0
            else:
                assert self.L1 is not None  # _one_length: fedpaq needs L1 or t0
                t0 = 4.0 * self.L1 / mu
            return 4.0 / (mu * ((k + t0) * b + 1))
        assert self.L1 is not None  # _one_length: fedpaq_capped needs L1
        return min(1.0 / self.L1, 4.0 / (mu * (k * b + 1)))


@dataclass
class ServerState:
    """The global model as one flat parameter vector (and, under `privacy:`, the clip norm of the next round)."""

    params: np.ndarray
    clip: float | None = field(default=None, kw_only=True)


@dataclass
class Broadcast:
    """What the server sends a round: θ_k and the round's step size η_k (and, under `privacy:`, the clip norm)."""

    params: np.ndarray
    lr: float
    clip: float | None = field(default=None, kw_only=True)


@dataclass
class WeightedDelta:
    """A client's upload: weight·(θ_c − θ_g) and the weight; summing two is a valid shard pre-reduction. Stacked
    (a batch's replies from `step_batch`), total is [k, d] (a tensor, where it was computed) and weight [k]."""

    total: Any
    weight: Any


@dataclass
class ClippedDelta(WeightedDelta):
    """A DP-FedAvg upload: the clipped update (weight 1) and whether it was within the clip norm before clipping
    (1.0 or 0.0; summed, the count adaptive clipping noises)."""

    below: Any = 0.0


@dataclass
class BatchPlan:
    """Index and weight of every sample of every local step ([steps, batch], or [clients, steps, batch]);
    weight 0 pads a short batch. NumPy arrays, or tensors on the device they were drawn on."""

    idx: Any
    w: Any


def batch_plans(sizes: np.ndarray, batch_size: int | None, local_steps: int | None, local_epochs: int | None,
                keys: Keys, width: int | None = None, device: Any = None) -> BatchPlan:
    """Every client's minibatches at once: without replacement within each pass over its data, a fresh uniformly
    random permutation per pass (the order of its keyed uniforms). idx and w are [k, steps, width]: client i's
    step s takes samples idx[i, s] where w[i, s] is 1; padding (a short last batch, a client with fewer steps, a
    width beyond its batch) has weight 0. A client's plan is a function of its key, its size and the settings
    only, not of which clients share the call (`width`, at least the largest batch among them, only pads). NumPy
    arrays, or with `device` the same plans as tensors there: a CPU's from NumPy's, an accelerator's drawn there (with
    no host work per client) or, from COMPILED_MIN clients, by the compiled kernel on every host core and copied
    (a few launches, where the draw there is some hundred)."""
    n, b, per_epoch, steps = _passes(sizes, batch_size, local_steps, local_epochs)
    epochs = -(-steps // per_epoch)  # passes begun
    width = max(int(b.max()), width or 0)
    on = torch.device("cpu" if device is None else device)
    if on.type != "cpu" and len(n) >= compiled.COMPILED_MIN:  # on the host's cores, then one copy of each
        from raysim.training.plan_kernel import device_host_plans
        idx, w = device_host_plans(n, b, per_epoch, steps, keys, int(steps.max()), width)
        return BatchPlan(*(torch.from_numpy(a).to(on, non_blocking=True).to(t) for a, t in ((idx, torch.int64),
                                                                                          (w, torch.float64))))
    if on.type != "cpu":
        return _device_plans(n, b, per_epoch, steps, epochs, keys, width, on)
    idx, w = _host_plans(n, b, per_epoch, steps, epochs, keys, width)
    return BatchPlan(idx, w) if device is None else BatchPlan(torch.from_numpy(idx), torch.from_numpy(w))


def _host_plans(n: np.ndarray, b: np.ndarray, per_epoch: np.ndarray, steps: np.ndarray, epochs: np.ndarray,
                keys: Keys, width: int) -> tuple[np.ndarray, np.ndarray]:
    """`batch_plans` on the host: compiled from COMPILED_MIN clients a call (`plan_kernel`: 2.7x less CPU and no
    interpreter lock), else in NumPy, group by group (`_host_groups`), every group's draws from one Philox evaluation
    (as their 53-bit integers: the uniforms' order without converting them)."""
    if len(n) >= compiled.COMPILED_MIN:
        from raysim.training.plan_kernel import host_plans  # numba's import and the kernel's load: 0.3-0.5 s, once
        return host_plans(n, b, per_epoch, steps, keys, int(steps.max()), width)
    groups = _host_groups(n)
    draws = keys.grouped_bits(groups, [int((epochs[g] * n[g]).max()) for g in groups])
    S = int(steps.max())
    if len(groups) == 1:  # one group holds every client in order: its plans are the batch's
        idx, valid = _host_plans_of(n, b, per_epoch, steps, int(epochs.max()), draws[0], S, width)
        return idx, np.broadcast_to(valid, idx.shape).astype(np.float64)
    idx, w = np.empty((len(n), S, width), dtype=np.int64), np.empty((len(n), S, width), dtype=np.float64)
    for g, u in zip(groups, draws):
        idx[g], w[g] = _host_plans_of(n[g], b[g], per_epoch[g], steps[g], int(epochs[g].max()), u, S, width)
    return idx, w


HOST_EXACT_MIN = 256  # clients of one size drawn as a group of their own: no gathers or padding, a few calls more


def _host_groups(n: np.ndarray) -> list[np.ndarray]:
    """The host's groups of clients drawn together: each size held by at least HOST_EXACT_MIN clients alone, the
    other clients by size class (sizes within a factor of two)."""
    sizes, inv, counts = np.unique(n, return_inverse=True, return_counts=True)
    label = np.where(counts >= HOST_EXACT_MIN, sizes, -np.ceil(np.log2(sizes)).astype(np.int64) - 1)[inv]
    order = np.argsort(label, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(label[order])) + 1)


def _host_plans_of(n: np.ndarray, b: np.ndarray, per_epoch: np.ndarray, steps: np.ndarray, E: int, u: np.ndarray,
                   S: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """`_plans_of` in NumPy: the index arithmetic done once per distinct size (a client's plan is its size's
    positions in its own permutations), the permutations sorted from each client's draws `u` [k, m] (`grouped_bits`,
    ordered as the uniforms are); the sample indices and where they are valid."""
    sizes, first, inv = np.unique(n, return_index=True, return_inverse=True)
    k, U, N = len(n), len(sizes), int(sizes[-1])
    n3, b3, p3, s3 = (a[first][:, None, None] for a in (n, b, per_epoch, steps))  # [U, 1, 1]
    s_ax, t_ax = np.arange(S)[:, None], np.arange(width)
    epoch, pos = s_ax // p3, s_ax % p3 * b3 + t_ax  # [U, S, 1], [U, S, width]
    valid = (t_ax < b3) & (pos < n3) & (s_ax < s3)
    at = np.minimum(epoch, E - 1) * N + np.minimum(pos, N - 1)  # where in a client's E passes of N its samples are
    if U == 1:  # one size: the uniforms are the passes, row by row
        keyed = u[:, :E * N].reshape(k, E, N)
    else:  # client i's pass e sorts its draws e*n_i .. e*n_i + n_i - 1, padding last
        j_ax = np.arange(N)
        draw = np.minimum(np.arange(E)[:, None] * n3 + j_ax, u.shape[1] - 1).reshape(U, -1)
        keyed = np.take_along_axis(u, draw[inv], 1).reshape(k, E, N)
        # padding sorts last: no draw exceeds 2^53 - 1, and one equal to it stands before the padding in its row
        keyed[np.broadcast_to(j_ax >= n3, (U, E, N))[inv]] = (1 << 53) - 1
    perm = stable_argsort(keyed).reshape(k, E * N)
    if U == 1:
        return perm[:, at[0]] * valid[0], valid[0]
    picked = np.take_along_axis(perm, at.reshape(U, -1)[inv], 1).reshape(k, S, width)
    return picked * valid[inv], valid[inv]


UNIQUE_SORT_LENGTHS = (6, 1 << 10)  # rows this long sort fastest with their positions as the keys' low bits


def stable_argsort(keys: np.ndarray) -> np.ndarray:
    """np.argsort(keys, axis=-1, kind="stable") of int64 keys in [0, 2^53). Rows of 6 to 1,024 keys take their
    positions as low bits, which makes every key of a row distinct: then any correct sort gives the stable order, and
    NumPy's quicksort (SIMD where the CPU has it) is 1.5x (10 keys) to 2.6x (1,000 keys) faster than its stable one."""
    n = keys.shape[-1]
    if not UNIQUE_SORT_LENGTHS[0] <= n <= UNIQUE_SORT_LENGTHS[1]:
        return np.argsort(keys, axis=-1, kind="stable")
    return np.argsort((keys << (n - 1).bit_length()) | np.arange(n), axis=-1)


def _device_plans(n: np.ndarray, b: np.ndarray, per_epoch: np.ndarray, steps: np.ndarray, epochs: np.ndarray,
                  keys: Keys, width: int, on: torch.device) -> BatchPlan:
    """`batch_plans` as tensors drawn on `on`: size classes merged while the padding is small (launches cost a
    GPU more than elements), one Philox evaluation, the groups joined by gathers (no scatter)."""
    S = int(steps.max())
    groups = _size_groups(n, epochs, DEVICE_PAD_ELEMENTS)
    draws = keys.grouped_uniforms(groups, [int((epochs[sel] * n[sel]).max()) for sel in groups], on)
    got = []
    for sel, u in zip(groups, draws):
        ns, bs, ps, ss = torch.from_numpy(np.stack([n[sel], b[sel], per_epoch[sel], steps[sel]])).to(on, non_blocking=True)
        got.append(_plans_of(ns, bs, ps, ss, int(epochs[sel].max()), int(n[sel].max()), u, S, width))
    idx, w = got[0]
    if len(groups) > 1:  # the groups' plans joined, then put in the clients' order: gathers, no scatter
        back = torch.from_numpy(np.argsort(np.concatenate(groups))).to(on, non_blocking=True)
        idx, w = (torch.cat([g[i] for g in got]).index_select(0, back) for i in (0, 1))
    return BatchPlan(idx, w)


def plan_sizes(sizes: np.ndarray, batch_size: int | None, local_steps: int | None,
               local_epochs: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(samples, steps) of every client's `batch_plans` without drawing them: where a plan's samples fall is random,
    how many there are is not. A pass over n samples takes ceil(n/b) steps, b = min(batch, n), the last one short;
    s steps are s // ceil(n/b) whole passes and then s mod ceil(n/b) full batches."""
    n, b, per_epoch, steps = _passes(sizes, batch_size, local_steps, local_epochs)
    return steps // per_epoch * n + steps % per_epoch * b, steps


def _passes(sizes: np.ndarray, batch_size: int | None, local_steps: int | None,
            local_epochs: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every client's size n, batch b = min(batch, n), steps a pass ceil(n/b) and steps taken."""
    n = np.asarray(sizes, dtype=np.int64)
    b = n if batch_size is None else np.minimum(batch_size, n)
    per_epoch = -(-n // b)
    if local_steps is not None:
        return n, b, per_epoch, np.full(n.size, local_steps, dtype=np.int64)
    assert local_epochs is not None, "batch plans need local_steps or local_epochs"
    return n, b, per_epoch, local_epochs * per_epoch


DEVICE_PAD_ELEMENTS = 1 << 20  # padding a merge may add to a GPU's draws to save a group's launches (some 35)


def _size_groups(n: np.ndarray, epochs: np.ndarray, budget: int) -> list[np.ndarray]:
    """A device's clients drawn together: each size class (sizes within a factor of two, so a pass pads to at most
    twice n), and neighbouring classes merged while a merge adds at most `budget` elements of padding to the draws
    (clients x passes x largest size; 0: none merged)."""
    bucket = np.ceil(np.log2(n)).astype(np.int64)
    groups: list[np.ndarray] = []
    top_e = top_n = 0
    for level in np.unique(bucket):
        sel = np.flatnonzero(bucket == level)
        e_sel, n_sel = int(epochs[sel].max()), int(n[sel].max())
        e, m = max(top_e, e_sel), max(top_n, n_sel)
        apart = len(groups[-1]) * top_e * top_n + len(sel) * e_sel * n_sel if groups else 0
        if groups and budget and (len(groups[-1]) + len(sel)) * e * m - apart <= budget:
            groups[-1], top_e, top_n = np.sort(np.concatenate([groups[-1], sel])), e, m
        else:
            groups.append(sel)
            top_e, top_n = e_sel, n_sel
    return groups


def _plans_of(n: torch.Tensor, b: torch.Tensor, per_epoch: torch.Tensor, steps: torch.Tensor, E: int, N: int,
              u: torch.Tensor, S: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch_plans` of clients of like size ([k, S, width]) on their tensors' device, passes begun at most E, size
    at most N, from their keyed uniforms `u` [k, m]: every pass's permutation sorts that pass's n uniforms."""
    on = n.device
    e_ax, j_ax = torch.arange(E, device=on)[:, None], torch.arange(N, device=on)[None, :]
    n3, b3 = n[:, None, None], b[:, None, None]
    draw = torch.clamp(e_ax * n3 + j_ax, max=u.shape[1] - 1)  # client i's pass e sorts its draws e*n_i .. e*n_i + n_i - 1
    drawn = torch.gather(u, 1, draw.reshape(len(n), -1)).reshape(draw.shape)
    keyed = torch.where(j_ax < n3, drawn, 2.0)  # [k, E, N]: each pass's permutation, padding last
    perm = torch.argsort(keyed, dim=2, stable=True)  # a stable sort's order is unique: NumPy's on the host, bit for bit
    s_ax, t_ax = torch.arange(S, device=on)[None, :, None], torch.arange(width, device=on)[None, None, :]
    epoch, chunk = torch.div(s_ax, per_epoch[:, None, None], rounding_mode="floor"), s_ax % per_epoch[:, None, None]
    pos = chunk * b3 + t_ax  # [k, S, width]
    valid = (t_ax < b3) & (pos < n3) & (s_ax < steps[:, None, None])
    rows = torch.arange(len(n), device=on)[:, None, None]
    picked = perm[rows, torch.clamp(epoch, max=E - 1), torch.clamp(pos, max=N - 1)]
    return torch.where(valid, picked, 0), valid.to(torch.float64)


def batch_plan(n: int, batch_size: int | None, local_steps: int | None, local_epochs: int | None,
               rng: np.random.Generator) -> BatchPlan:
    """One client's minibatches ([steps, batch]) from its generator's key: the very plan `batch_plans` gives it."""
    bp = batch_plans(np.array([n]), batch_size, local_steps, local_epochs, Keys.of([rng]))
    return BatchPlan(bp.idx[0], bp.w[0])


def _one(v: Any) -> Any:
    """A one-client stacked field as that client's value: its row, or its number."""
    v = host(v)
    return v[0] if np.ndim(v) > 1 else float(v[0])


def noise_split(z: float, adaptive: Any, k: int) -> tuple[float, float]:
    """(z_Δ, σ_b): the updates' noise multiplier and the count's noise std. Without adaptive clipping (z, 0); with
    it σ_b (default k/20) and z_Δ = (z⁻² − (2σ_b)⁻²)^(-1/2), so that the pair spends what z alone would (Andrew et
    al., 2021, Thm. 1)."""
    if adaptive is None:
        return z, 0.0
    sigma_b = adaptive.count_noise if adaptive.count_noise is not None else k / 20
    if z == 0:
        return 0.0, sigma_b
    if 2 * sigma_b <= z:
        raise ValueError(f"privacy.adaptive_clip.count_noise: {sigma_b:g} must exceed noise_multiplier/2 = {z / 2:g}")
    return (z ** -2 - (2 * sigma_b) ** -2) ** -0.5, sigma_b


def clip_rows(deltas: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row scaled to L2 norm at most `clip`, in place: Δ_i · min(1, C/‖Δ_i‖). Returns which rows were within
    the norm already (bool [k])."""
    norms = torch.linalg.vector_norm(deltas, dim=1)
    deltas.mul_((clip / norms.clamp_min(torch.finfo(deltas.dtype).tiny)).clamp_max(1.0)[:, None])
    return norms <= clip


def rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """x[idx] for an index of any shape, as one `index_select` of the flattened index: advanced indexing by a
    2-d index is four times slower."""
    return x.index_select(0, idx.reshape(-1)).view(*idx.shape, *x.shape[1:])


class LocalSGD(Algorithm):
    """FedAvg/FedPAQ with partial participation, b local SGD steps and a server learning rate (unregistered:
    the fedavg family registers it as `fedavg`; other families subclass it). Its state, broadcast and reply
    types are the ones below, but the hooks take the contract's Any: subclasses (SCAFFOLD, sketching, server
    optimizers) bring their own."""

    Params: ClassVar[type[BaseModel] | None] = LocalSGDParams
    reducible = True
    supports_privacy: ClassVar[bool] = True  # DP-FedAvg: `privacy:` clips the uploads and noises their sum
    mu = 0.0

    @classmethod
    def config_problems(cls, params: Any, cfg: Any) -> list[str]:
        """Under `privacy:`, QSGD's unbiased rounding can lengthen a clipped update past C: refused."""
        if cfg.privacy is not None and params.quantizer != "none":
            return [f"algorithm.quantizer: {params.quantizer!r} can lengthen a clipped update past privacy.clip;"
                    " DP-FedAvg needs quantizer 'none'"]
        return []

    @classmethod
    def metric_names(cls, cfg: Any) -> frozenset[str] | None:
        """Test accuracy (class labels) and loss, train loss and objective; ε, the noise multiplier and the clip
        under `privacy:`; the clients' loss and accuracy summaries under `eval.clients`."""
        privacy = {"epsilon", "noise_multiplier", "clip"} if cfg.privacy is not None else set()
        clients = summary_names("loss") + summary_names("accuracy") if cfg.eval.clients != "none" else []
        return frozenset({"test_accuracy", "test_loss", "train_loss", "train_objective", *privacy, *clients})

    def __init__(self, ctx):
        super().__init__(ctx)
        problem = loss_problem(self.params.loss, ctx.num_classes, tuple(ctx.target_shape))
        if problem:
            raise ConfigError(problem)
        self.module, self.spec, self.dtype, self.device = placed_model(ctx)
        largest = int(np.max(ctx.client_sizes))
        self.batch_width = largest if self.params.batch_size is None else min(self.params.batch_size, largest)
        self._vgrad = VmappedGrad(self._loss, self.module, self.spec, tuple(ctx.feature_shape), self.dtype, self.device,
                                  self.batch_width, ctx.clients_per_round)
        self._stacked = stacked_grad(self.module, tuple(ctx.feature_shape), self.spec, self.params.loss,
                                     lambda out, y: sample_losses(out, y, self.params.loss), self.params.l2)

    def _loss(self, params: dict, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        losses = sample_losses(functional_call(self.module, params, (x,)), y, self.params.loss)
        reg = 0.5 * self.params.l2 * squared_norm(params) if self.params.l2 else 0.0
        return (w * losses).sum() / w.sum().clamp_min(1.0) + reg

    def batch_grads(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                    out: torch.Tensor | None = None) -> torch.Tensor:
        """Every client's minibatch gradient of `_loss` at rows θ [k, d] at once (into `out` when given): stacked
        matmuls where the model is a chain of linear layers (raysim.training.stacked: the same bits), else a vmapped
        forward in calls of a fixed number of clients (raysim.training.vmapped). Either way a client's gradient is the
        same whichever clients share the call."""
        if self._stacked is not None:
            return self._stacked(theta, x, y, w, out)
        return self._vgrad(theta, x, y, w, out)

    def objective(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """F(θ) = mean per-sample loss + (l2/2)‖θ‖² on (x, y), in θ's dtype (differentiable)."""
        params = self.spec.unflatten(theta)
        out = functional_call(self.module, params, (x.to(theta.dtype),))
        return sample_losses(out, y, self.params.loss).mean() + 0.5 * self.params.l2 * (theta * theta).sum()

    def init(self) -> Any:
        theta = initial_vector(self.ctx.model, self.ctx.feature_shape, self.ctx.image_shape,
                               self.ctx.num_classes, self.ctx.seed)
        return ServerState(np.zeros_like(theta) if self.params.theta0 == "zeros" else theta,
                           clip=None if self.ctx.privacy is None else float(self.ctx.privacy.clip))

    def plan(self, state: Any, round: int, rng: np.random.Generator) -> Plan:
        clients = sample_clients(self.ctx.num_clients, self.ctx.clients_per_round, rng)
        return Plan(clients, Broadcast(state.params, self.params.step_size(max(round - 1, 0)), clip=state.clip))

    def _unpack(self, broadcast: Broadcast | np.ndarray) -> tuple[torch.Tensor, float]:
        """(θ_g, η) of a broadcast; a bare parameter vector stands for the constant lr."""
        if isinstance(broadcast, Broadcast):
            theta, lr = broadcast.params, broadcast.lr
        elif self.params.lr_schedule == "constant":
            theta, lr = broadcast, self.params.lr
        else:
            raise ValueError(f"fedavg: lr_schedule {self.params.lr_schedule!r} needs a Broadcast with the round's lr")
        # a host copy of its own (Ray's arrays are read-only), sent without waiting for the device's queued work
        return torch.from_numpy(np.array(theta)).to(self.device, self.dtype, non_blocking=True), lr

    def _plans(self, sizes: np.ndarray, keys: Keys, width: int | None = None) -> BatchPlan:
        """The clients' batch plans, drawn as tensors on the model's device."""
        p = self.params
        return batch_plans(sizes, p.batch_size, p.local_steps, p.local_epochs, keys, width, self.device)

    def _uploads(self, deltas: torch.Tensor, sizes: np.ndarray, keys: Keys,
                 clip: float | None = None) -> tuple[WeightedDelta, Costs]:
        """The weighted uploads Q(Δ) of the clients' Δ = θ_c − θ_g [k, d] (QSGD's uniforms keyed "qsgd") and costs.
        Unquantized, the uploads stay where Δ was computed (a GPU shard reduces them there), weighted in place."""
        p = self.params
        weights = sizes.astype(np.float64) if p.weighting == "samples" and self.ctx.privacy is None else np.ones(len(sizes))
        d = deltas.shape[1]
        below = None
        if self.ctx.privacy is not None:  # DP-FedAvg: each update clipped to L2 norm C (the broadcast's), weighing 1
            below = host(clip_rows(deltas, clip if clip is not None else self.ctx.privacy.clip)).astype(np.float64)
        total: np.ndarray | torch.Tensor
        if p.quantizer == "qsgd":
            q = qsgd_rows(host(deltas), p.levels, keys.uniforms(d, "qsgd"))
            total = weights.astype(q.dtype)[:, None] * q
        else:
            total = deltas.mul_(torch.from_numpy(weights).to(deltas.device, deltas.dtype, non_blocking=True)[:, None])
        return (WeightedDelta(total, weights) if below is None else ClippedDelta(total, weights, below)), self._costs(sizes)

    def _costs(self, sizes: np.ndarray) -> Costs:
        """The Costs of clients of `sizes` samples: the samples and steps their batch plans take (`plan_sizes`: known
        without drawing the plans, so a GPU's steps are not waited for), one model-sized upload (QSGD's bytes, as a
        fraction of it, when quantized)."""
        p, d = self.params, self.spec.size
        calls, batches = plan_sizes(sizes, p.batch_size, p.local_steps, p.local_epochs)
        full = d * torch.empty(0, dtype=self.dtype).element_size()
        nbytes = qsgd_bytes(d, p.levels) if p.quantizer == "qsgd" else full
        k = len(calls)
        return Costs(calls, batches, np.full(k, nbytes / full), np.full(k, nbytes, dtype=np.int64))

    def plan_costs(self, clients: np.ndarray, keys: Keys) -> Costs:
        """The clients' Costs from the sizes of the batch plans their steps will draw (`plan_sizes`)."""
        return self._costs(np.asarray(self.ctx.client_sizes)[clients])

    def stale(self, reply: Any, weight: float, sent: Any, now: Any, mix: bool) -> Any:
        """The upload w*delta scaled by `weight`; with `mix`, w*(theta_sent + delta - theta_now) scaled: aggregated
        alone with server_lr 1 it is FedAsync's theta <- (1 - a) theta_now + a (theta_sent + delta)."""
        total = reply.total + reply.weight * (sent.params - now.params) if mix else reply.total
        return replace(reply, total=total * weight)

    def step(self, cstate: Any, data: ClientData, broadcast: Any, rng: np.random.Generator) -> tuple[Any, Any, Cost]:
        """The per-client reference: local SGD on one client, one step at a time, through `batch_grads` (the plan
        and the bits `step_batch` gives it)."""
        theta_g, lr = self._unpack(broadcast)
        theta = theta_g.clone()[None]
        keys = Keys.of([rng])
        sizes = np.array([len(data)])
        bp = self._plans(sizes, keys)
        idx, w = bp.idx[0], bp.w[0].to(self.dtype)
        opt, one = self.params.local_optimizer.start(theta), torch.ones((1, 1), dtype=self.dtype, device=self.device)
        correction = self.correction([cstate], broadcast)
        for s in range(bp.idx.shape[1]):
            g = self.batch_grads(theta, data.x[idx[s]][None], data.y[idx[s]][None], w[s][None])
            g = g + self.mu * (theta - theta_g)
            opt.step(theta, g if correction is None else g + correction, lr, one)
        reply, costs = self._uploads(theta - theta_g, sizes, keys, getattr(broadcast, "clip", None))
        return type(reply)(**{f.name: _one(getattr(reply, f.name)) for f in fields(reply)}), None, costs.cost(0)

    def correction(self, cstates: list, broadcast) -> torch.Tensor | None:
        """A fixed term [k, d] added to every local gradient of the round's clients (SCAFFOLD's c − c_i); None here."""
        return None

    def _train(self, cstates: list | None, batch: ClientBatch, plans: BatchPlan, broadcast: Any) -> torch.Tensor:
        """Local SGD of all the batch's clients at once over stacked parameters; their Δ = θ_c − θ_g [k, d], on the
        model's device."""
        k = len(batch)
        base = torch.from_numpy(batch.starts[:, None]).to(self.device, non_blocking=True)
        idx = plans.idx + base[:, :, None]  # rows of the batch's block
        w = plans.w.to(self.dtype)
        active = (w.sum(2, keepdim=True) > 0).to(self.dtype)  # every real step has at least one sample
        theta_g, lr = self._unpack(broadcast)
        theta = theta_g.expand(k, -1).clone()
        opt = self.params.local_optimizer.start(theta)
        correction = self.correction(cstates if cstates is not None else [None] * k, broadcast)
        buffer = torch.empty_like(theta)  # every step's gradients, in one buffer
        for s in range(plans.idx.shape[1]):
            g = self.batch_grads(theta, rows(batch.x, idx[:, s]), rows(batch.y, idx[:, s]), w[:, s], buffer)
            if self.mu:
                g = g + self.mu * (theta - theta_g)
            if correction is not None:
                g = g + correction
            opt.step(theta, g, lr, active[:, s])  # in place: plain SGD makes no new k x d buffers per step
        return theta.sub_(theta_g)

    def step_batch(self, cstates: list | None, batch: ClientBatch, broadcast: Any, keys: Keys) -> Steps:
        """All clients of a shard at once: stacked parameters, the stacked or vmapped minibatch gradients (also for
        one client, so a client's numbers do not depend on how many share its shard), a padded width the same in
        every shard (`batch_width`)."""
        if not len(batch):
            return Steps(WeightedDelta(np.zeros((0, self.spec.size)), np.zeros(0)), None, Costs.of([]))
        sizes = batch.sizes
        plans = self._plans(sizes, keys, self.batch_width)
        replies, costs = self._uploads(self._train(cstates, batch, plans, broadcast), sizes, keys,
                                       getattr(broadcast, "clip", None))
        return Steps(replies, None, costs)

    def step_many(self, cstates: list[Any], datas: list[ClientData], broadcast: Any,
                  rngs: list[np.random.Generator]) -> list[tuple[Any, Any, Cost]]:
        """`step_batch` of the clients `datas`, as per-client (reply, state, cost)."""
        if not datas:
            return []
        out = self.step_batch(cstates, ClientBatch.of(datas), broadcast, Keys.of(rngs))
        cols = {f.name: host(getattr(out.replies, f.name)) for f in fields(out.replies)}
        return [(type(out.replies)(**{n: v[i] if v.ndim > 1 else float(v[i]) for n, v in cols.items()}), None,
                 out.costs.cost(i)) for i in range(len(datas))]

    def reduce(self, replies: list[Any]) -> Any:
        """The fieldwise sum of uploads (WeightedDelta, or ClippedDelta under `privacy:`)."""
        first = replies[0]
        return type(first)(**{f.name: np.sum([r.total for r in replies], axis=0) if f.name == "total"
                              else sum(getattr(r, f.name) for r in replies) for f in fields(first)})

    def aggregate(self, state: Any, replies: list[Any], rng: np.random.Generator) -> tuple[Any, Cost]:
        if self.ctx.privacy is None:
            if not replies:
                return state, Cost()
            total = self.reduce(replies)  # (η_s Σ w_iΔ_i) / Σ w_i, in this order: the bits FedAvg always had
            return ServerState(state.params + self.params.server_lr * total.total / total.weight), Cost()
        update, clip = self.mean_update(replies, state, rng)
        return ServerState(state.params + self.params.server_lr * update, clip=clip), Cost()

    def mean_update(self, replies: list[Any], state: Any, rng: np.random.Generator) -> tuple[np.ndarray, float | None]:
        """The round's pseudo-gradient and the next round's clip norm. Without `privacy:`, the replies' weighted
        mean Δ. Under it, DP-FedAvg's noised mean (Σ clip(Δ_i) + N(0, (z_Δ C)² I)) / k over the k clients kept a
        round (McMahan et al., 2018, Alg. 1 with the fixed denominator); with adaptive clipping (Andrew et al., 2021,
        Alg. 1) C moves geometrically towards the quantile: C ← C·exp(−η_C (b̃ − γ)), b̃ the noised fraction of
        updates within C (noise σ_b), and z_Δ = (z⁻² − (2σ_b)⁻²)^(-1/2) keeps the run's privacy that of z (their
        Thm. 1). The noises come from the round's aggregation stream, the updates' first."""
        p = self.ctx.privacy
        if p is None:
            total = self.reduce(replies)
            return total.total / total.weight, None
        k, clip = self.ctx.kept_per_round, float(state.clip if state.clip is not None else p.clip)
        summed = self.reduce(replies) if replies else ClippedDelta(np.zeros_like(state.params), 0.0, 0.0)
        z_update, sigma_b = noise_split(self.noise_multiplier, p.adaptive_clip, k)
        noised = summed.total.astype(np.float64) + z_update * clip * rng.standard_normal(state.params.shape)
        update = (noised / k).astype(state.params.dtype)
        a = p.adaptive_clip
        if a is None:
            return update, clip
        fraction = (float(summed.below) + sigma_b * rng.standard_normal()) / k
        return update, clip * math.exp(-a.lr * (fraction - a.quantile))

    @functools.cached_property
    def noise_multiplier(self) -> float:
        """z: the configured one, or the least that spends privacy.target_epsilon over the run."""
        p = self.ctx.privacy
        if p.noise_multiplier is not None:
            return float(p.noise_multiplier)
        return calibrated_noise(self.ctx.num_clients, self.ctx.clients_per_round, self.ctx.rounds, p.target_epsilon, p.delta)

    def round_metrics(self, state: Any, round: int) -> dict[str, float]:
        """Under `privacy:`, the ε spent after this round (at privacy.delta), the noise multiplier and the clip."""
        p = self.ctx.privacy
        if p is None:
            return {}
        eps = epsilon_after(self.ctx.num_clients, self.ctx.clients_per_round, self.noise_multiplier, round, p.delta)
        return {"epsilon": eps, "noise_multiplier": self.noise_multiplier,
                "clip": float(state.clip if state.clip is not None else p.clip)}

    def eval_payload(self, state: Any) -> np.ndarray:
        """The global parameter vector θ."""
        return state.params

    def evaluate_clients(self, payload: Any, cstates: list | None, batch: ClientBatch) -> dict[str, np.ndarray]:
        """Each client's loss (mean per-sample loss) and, under ce with class labels, accuracy of θ on its own rows:
        in chunks of CLIENT_EVAL_ROWS rows, each its own matrix of one fixed shape (stacked where the model is a
        chain of linear layers, else one forward a chunk), and each client's sums taken in row order, so a
        client's numbers do not depend on which clients share the batch."""
        if not len(batch):
            return {"loss": np.zeros(0)}
        if not batch.sizes.all():  # a client without rows has no metrics (NaN): the others evaluated alone
            held = np.flatnonzero(batch.sizes)
            part = self.evaluate_clients(payload, None, ClientBatch(batch.ids[held], batch.starts[held], batch.sizes[held],
                                                                    batch.x, batch.y))
            return {n: _spread(v, held, len(batch)) for n, v in part.items()}
        theta = torch.tensor(payload, dtype=self.dtype, device=self.device)  # a copy: Ray's arrays are read-only
        sizes, C = batch.sizes, CLIENT_EVAL_ROWS
        chunks = -(-sizes // C)
        owner = np.repeat(np.arange(len(sizes)), chunks)
        pos = (np.arange(owner.size) - np.repeat(np.cumsum(chunks) - chunks, chunks))[:, None] * C + np.arange(C)
        valid = pos < sizes[owner][:, None]  # [chunks, C]: the chunk's rows that are the client's
        idx = torch.from_numpy(batch.starts[owner][:, None] + np.where(valid, pos, 0)).to(self.device)
        x, y = rows(batch.x, idx), rows(batch.y, idx)
        params = self.spec.unflatten(theta)
        with torch.no_grad():
            if self._stacked is not None:
                outs = [self._stacked.forward(self.spec.unflatten(theta.expand(len(part), -1).contiguous()), part)
                        for part in x.split(CLIENT_EVAL_GROUP)]
            else:
                outs = [functional_call(self.module, params, (chunk,))[None] for chunk in x]
            out = torch.cat(outs).flatten(0, 1)
            labels = y.flatten(0, 1)
            if self.params.loss == "ce" and not labels.is_floating_point():
                losses, pred = class_metrics(out, labels)
                right = host(pred == labels).reshape(valid.shape)[valid].astype(np.float64)
            else:
                losses, right = sample_losses(out, labels, self.params.loss), None
        at = np.cumsum(sizes) - sizes  # each client's first row among the valid ones, in order
        loss = np.add.reduceat(host(losses).reshape(valid.shape)[valid].astype(np.float64), at) / sizes
        m = {"loss": loss}
        if right is not None:
            m["accuracy"] = np.add.reduceat(right, at) / sizes
        return m

    def export(self, state: Any) -> nn.Module:
        """The configured model (on the CPU) holding the server's parameters θ."""
        return self.spec.module_with(self.module, state.params, self.dtype)

    def evaluate(self, state: Any, data: EvalData) -> dict[str, float]:
        """Test accuracy (class labels under ce) and loss; the loss and the objective F(θ) (loss +
        (l2/2)‖θ‖²) on (a capped sample of) the pooled training data."""
        theta = torch.tensor(state.params, dtype=self.dtype, device=self.device)
        params = self.spec.unflatten(theta)
        kind = self.params.loss
        data = data.to(self.device)
        with torch.no_grad():
            out = functional_call(self.module, params, (data.test_x,))
            train_loss = float(sample_losses(functional_call(self.module, params, (data.train_x,)), data.train_y, kind).mean())
        m = {}
        if kind == "ce" and not data.test_y.is_floating_point():
            losses, pred = class_metrics(out, data.test_y)
            m["test_accuracy"] = float((pred == data.test_y).double().mean())
        else:
            losses = sample_losses(out, data.test_y, kind)
        m["test_loss"] = float(losses.mean())
        m["train_loss"] = train_loss
        m["train_objective"] = train_loss + 0.5 * self.params.l2 * float((theta.double() ** 2).sum())
        return m
