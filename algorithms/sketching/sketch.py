"""Sketching operators R ∈ R^{b×d} for iterative sketching (the sketching paper).

`make_sketch(kind, b, d, seed, round)` is a pure function of (seed, round): every client and the
server's evaluation replica build the same R_t from the shared seed, so no matrix is ever sent.
Each operator is matrix-free: `sk(x) = R x` maps [..., d] -> [..., b], `desk(y) = Rᵀ y` maps
[..., b] -> [..., d] (both torch, differentiable, batched over leading dims); `.matrix()` is the
dense R for tests. Hashes are fully random draws from the seeded stream, which satisfies the
2-/4-wise independence the paper asks for (Defs. D.4-D.7).
"""
from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
import torch

from raysim.core.rng import SERVER, stream

Kind = Literal["none", "gaussian", "srht", "ams", "countsketch", "sparse_i", "sparse_ii", "uniform"]
KINDS: tuple[Kind, ...] = get_args(Kind)
# Table 1's coordinate-wise embedding constant a (alpha = a d / b); `uniform` is outside the paper (Remark D.17).
PAPER_A = {"none": 0.0, "gaussian": 3.0, "srht": 2.0, "ams": 2.0, "countsketch": 3.0, "sparse_i": 2.0, "sparse_ii": 2.0}


def next_pow2(d: int) -> int:
    """The smallest power of two >= d (SRHT zero-pads to it)."""
    return 1 << max(0, (d - 1).bit_length())


def srht_second_moment(b: int, d: int) -> float:
    """c_R of the zero-padded SRHT R = sqrt(d'/b) S H D P (P pads R^d with zeros to d' = next_pow2(d)):
    d/b + (b−1)(d'−d)/(b(d'−1)); the naive d'/b holds only for d = d'. Derivation in the README."""
    dp = next_pow2(d)
    return d / b + (b - 1) * (dp - d) / (b * (dp - 1)) if dp > d else d / b


def second_moment(kind: str, b: int, d: int) -> float:
    """Exact c_R = E‖RᵀR v‖² / ‖v‖² for every v (README; SRHT corrected for zero padding)."""
    exact = {"none": 1.0, "gaussian": 1 + (d + 1) / b, "srht": srht_second_moment(b, d), "ams": 1 + (d - 1) / b,
             "countsketch": 1 + (d - 1) / b, "sparse_i": 1 + (d - 1) / b, "sparse_ii": 1 + (d - 1) / b,
             "uniform": d / b}
    return exact[kind]


def paper_alpha(kind: str, b: int, d: int) -> float:
    """The paper's variance parameter α = a d / b (Thm 4.2, Table 1); step sizes use η ≤ 1/((1+α)L)."""
    if kind not in PAPER_A:
        raise ValueError(f"sketch kind {kind!r} has no constant in the paper's Table 1; allowed: {sorted(PAPER_A)}")
    return PAPER_A[kind] * d / b


def fwht(a: torch.Tensor) -> torch.Tensor:
    """Orthonormal fast Walsh–Hadamard transform over the last dim (a power of two), O(n log n)."""
    n = a.shape[-1]
    lead = a.shape[:-1]
    h = 1
    while h < n:
        a = a.reshape(*lead, n // (2 * h), 2, h)
        a = torch.stack((a[..., 0, :] + a[..., 1, :], a[..., 0, :] - a[..., 1, :]), dim=-2)
        h *= 2
    return a.reshape(*lead, n) / math.sqrt(n)


class Sketch:
    """A linear map R: R^d -> R^b given by `sk`, with adjoint `desk`."""

    kind: str = ""
    dtype: torch.dtype  # set by each kind
    device: torch.device

    def __init__(self, b: int, d: int):
        self.b, self.d = b, d

    def sk(self, x: torch.Tensor) -> torch.Tensor:
        """R x for x of shape [..., d]."""
        raise NotImplementedError

    def desk(self, y: torch.Tensor) -> torch.Tensor:
        """Rᵀ y for y of shape [..., b]."""
        raise NotImplementedError

    def matrix(self) -> torch.Tensor:
        """The dense b×d matrix R (tests only): R applied to the identity."""
        eye = torch.eye(self.d, dtype=self.dtype, device=self.device)
        return self.sk(eye).T.contiguous()


class Identity(Sketch):
    """`none`: R = I_d (b = d), the unsketched reduction."""

    kind = "none"

    def __init__(self, d: int, dtype: torch.dtype, device: torch.device):
        super().__init__(d, d)
        self.dtype, self.device = dtype, device

    def sk(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def desk(self, y: torch.Tensor) -> torch.Tensor:
        return y


class Dense(Sketch):
    """A materialised R (Gaussian, Def. D.2; AMS, Def. D.4): O(bd) per apply."""

    def __init__(self, kind: str, R: torch.Tensor):
        super().__init__(*R.shape)
        self.kind, self.R = kind, R
        self.dtype, self.device = R.dtype, R.device

    def sk(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.R.T

    def desk(self, y: torch.Tensor) -> torch.Tensor:
        return y @ self.R


class ColumnSparse(Sketch):
    """R with s stored entries per column: R[rows[i, j], i] = vals[i, j] (Count-Sketch, sparse I/II, uniform).

    `desk` gathers per column, so it never scatters with collisions (bitwise deterministic on GPUs too).
    """

    def __init__(self, kind: str, b: int, rows: torch.Tensor, vals: torch.Tensor):
        super().__init__(b, rows.shape[0])
        self.kind, self.rows, self.vals = kind, rows, vals
        self.flat_rows = rows.reshape(-1)
        self.dtype, self.device = vals.dtype, vals.device

    def sk(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        src = (x[..., :, None] * self.vals).reshape(*lead, -1)
        return torch.zeros(*lead, self.b, dtype=x.dtype, device=x.device).index_add(-1, self.flat_rows, src)

    def desk(self, y: torch.Tensor) -> torch.Tensor:
        return (y[..., self.rows] * self.vals).sum(-1)


class SRHT(Sketch):
    """R = sqrt(d'/b) S H D on x zero-padded to d' = 2^⌈log2 d⌉ (Def. D.3; the padding: README); O(d' log d')."""

    kind = "srht"

    def __init__(self, b: int, d: int, signs: torch.Tensor, idx: torch.Tensor):
        super().__init__(b, d)
        self.dp = signs.shape[0]
        self.signs, self.idx = signs, idx
        self.scale = math.sqrt(self.dp / b)
        self.dtype, self.device = signs.dtype, signs.device

    def sk(self, x: torch.Tensor) -> torch.Tensor:
        z = torch.nn.functional.pad(x, (0, self.dp - self.d)) * self.signs
        return fwht(z)[..., self.idx] * self.scale

    def desk(self, y: torch.Tensor) -> torch.Tensor:
        lead = y.shape[:-1]
        z = torch.zeros(*lead, self.dp, dtype=y.dtype, device=y.device).index_add(-1, self.idx, y * self.scale)
        return (fwht(z) * self.signs)[..., : self.d]


def _signs(rng: np.random.Generator, shape) -> np.ndarray:
    return rng.integers(0, 2, shape) * 2.0 - 1.0


def _distinct_rows(rng: np.random.Generator, d: int, b: int, s: int) -> np.ndarray:
    """For each of d columns, s distinct rows of [b] uniformly without replacement, O(d s²)."""
    chosen = np.zeros((d, 0), dtype=np.int64)
    for j in range(s):
        r = rng.integers(0, b - j, d)
        for k in range(j):  # map r to the r-th row not yet chosen (chosen is sorted per column)
            r = r + (r >= chosen[:, k])
        chosen = np.sort(np.concatenate([chosen, r[:, None]], axis=1), axis=1)
    return rng.permuted(chosen, axis=1)


def check_sketch(kind: str, b: int, d: int, nnz_per_col: int = 1) -> None:
    """Raise a ValueError naming the field when (kind, b, d, nnz_per_col) is not a valid sketch."""
    if kind not in KINDS:
        raise ValueError(f"sketch: unknown kind {kind!r}; allowed: {list(KINDS)}")
    if kind == "none" and b != d:
        raise ValueError(f"b_sketch: kind 'none' is the identity, so b must equal d={d} (got {b})")
    if not 1 <= b <= d:
        raise ValueError(f"b_sketch: must be in [1, d={d}] (got {b})")
    if kind in ("sparse_i", "sparse_ii") and not 1 <= nnz_per_col <= b:
        raise ValueError(f"nnz_per_col: must be in [1, b={b}] (got {nnz_per_col})")
    if kind == "sparse_ii" and b % nnz_per_col:
        raise ValueError(f"nnz_per_col: sparse_ii needs nnz_per_col to divide b={b} (got {nnz_per_col})")


def make_sketch(kind: str, b: int, d: int, seed: int, round: int, nnz_per_col: int = 1,
                dtype: torch.dtype = torch.float64, device: str | torch.device = "cpu") -> Sketch:
    """R_round of `kind`, a pure function of (seed, round): drawn on the CPU from stream(seed, round, server, "sketch").

    Random state is always generated on the CPU with numpy and then moved, so a GPU replica
    builds the same matrix as a CPU one.
    """
    check_sketch(kind, b, d, nnz_per_col)
    device = torch.device(device)
    if kind == "none":
        return Identity(d, dtype, device)
    rng = stream(seed, round, SERVER, "sketch")

    def t(a: np.ndarray, dt=dtype) -> torch.Tensor:
        return torch.as_tensor(a, dtype=dt, device=device)

    if kind == "gaussian":
        return Dense(kind, t(rng.standard_normal((b, d)) / math.sqrt(b)))
    if kind == "ams":
        return Dense(kind, t(_signs(rng, (b, d)) / math.sqrt(b)))
    if kind == "srht":
        dp = next_pow2(d)
        return SRHT(b, d, t(_signs(rng, dp)), t(rng.choice(dp, b, replace=False), torch.int64))
    if kind == "countsketch":
        rows, vals = rng.integers(0, b, (d, 1)), _signs(rng, (d, 1))
    elif kind == "sparse_i":
        rows = _distinct_rows(rng, d, b, nnz_per_col)
        vals = _signs(rng, rows.shape) / math.sqrt(nnz_per_col)
    elif kind == "sparse_ii":
        block = b // nnz_per_col
        rows = np.arange(nnz_per_col) * block + rng.integers(0, block, (d, nnz_per_col))
        vals = _signs(rng, rows.shape) / math.sqrt(nnz_per_col)
    else:  # uniform: R = sqrt(d/b) S D, b sampled coordinates (outside the paper's guarantees)
        idx = rng.choice(d, b, replace=False)
        rows, vals = np.zeros((d, 1), dtype=np.int64), np.zeros((d, 1))
        rows[idx, 0] = np.arange(b)
        vals[idx, 0] = _signs(rng, b) * math.sqrt(d / b)
    return ColumnSparse(kind, b, t(rows, torch.int64), t(vals))
