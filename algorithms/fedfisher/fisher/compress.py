"""Upload compression of App. C (the FedFisher paper): uniform quantization and truncated SVD, with
the bits each costs.

Quantization to b bits (one sign bit, b − 1 magnitude bits, round to nearest) keeps ‖x‖_∞ as a 32-bit scale:
Q(x) = ‖x‖_∞ round(l x/‖x‖_∞)/l with l = 2^(b−1) − 1 levels; the paper code's `quantize(A, s)` is b = s + 1.
A factor kept at rank r is U_r, S_r, V_r of its SVD, each quantized on its own: b(2mr + r) + 3·32 bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from raysim.algorithms.fedfisher.fisher.kfac import KFAC, KFACBlock
from raysim.models import ParamSpec

SCALE_BITS = 32
CompressionKind = Literal["none", "paper", "explicit"]
PAPER_WEIGHT_BITS = 16  # quantize_layer(v, model, 15): 15 magnitude bits and a sign (s_q = 2)
PAPER_FACTOR_BITS = 9  # quant_comp 4 -> quantize(A, 8): 255 levels (8 magnitude bits) and a sign


def quantize(x: np.ndarray, bits: int) -> tuple[np.ndarray, int]:
    """Q(x) with `bits` bits per entry and one 32-bit scale (App. C, with the code's round-to-nearest); (Q(x), bits)."""
    x = np.asarray(x, dtype=np.float64)
    scale = np.abs(x).max(initial=0.0)
    levels = 2 ** (bits - 1) - 1
    q = x if scale == 0 else np.round(levels * x / scale) * scale / levels
    return q, bits * x.size + SCALE_BITS


def quantize_per_tensor(flat: np.ndarray, spec: ParamSpec, bits: int) -> tuple[np.ndarray, int]:
    """A flat vector quantized tensor by tensor of `spec` (the code's `quantize_layer`); (vector, bits)."""
    out, total, i = np.empty(len(flat), dtype=np.float64), 0, 0
    for shape in spec.shapes:
        n = int(np.prod(shape))
        out[i : i + n], b = quantize(flat[i : i + n], bits)
        total, i = total + b, i + n
    return out, total


def low_rank(m: np.ndarray, rank: int, bits: int) -> tuple[np.ndarray, int]:
    """U_r Q(S_r) V_r^T with Q-quantized U_r, S_r, V_r of m's SVD at r = min(rank, dim) (the code's `compress_mat`)."""
    u, s, vt = np.linalg.svd(np.asarray(m, dtype=np.float64))
    r = min(rank, len(s))
    (uq, bu), (sq, bs), (vq, bv) = quantize(u[:, :r], bits), quantize(s[:r], bits), quantize(vt[:r], bits)
    return (uq * sq) @ vq, bu + bs + bv


def paper_rank(kfac: KFAC, d: int) -> int:
    """The code's SVD rank int(2d / Σ_l (2 dim A_l + 2 dim G_l + 2)), which puts the factors at about 16d bits
    (50 for LeNet, 243 for the CNN; App. C's 16d budget)."""
    return int(2 * d / sum(2 * len(b.A) + 2 * len(b.G) + 2 for b in kfac.blocks))


@dataclass(frozen=True)
class Compression:
    """How an upload is compressed: `none`; `paper` (App. C as the code runs it: 16-bit weights and diagonal,
    K-FAC factors at the code's rank with 9-bit U, S, V); or `explicit` (16-bit weights, the Fisher quantized to
    ⌊32/s_q⌋ bits and, for s_v > 1, each m x m K-FAC factor kept at rank ⌊m/(2 s_v)⌋; App. C's formulas).
    K-FAC's diagonal block (parameters outside Linear/Conv layers, README) is quantized per tensor as Diag's Fisher."""

    kind: CompressionKind = "none"
    s_q: float = 4.0
    s_v: float = 1.0

    def fisher_bits(self) -> int:
        return PAPER_WEIGHT_BITS if self.kind == "paper" else int(32 // self.s_q)

    def factor(self, m: np.ndarray, rank: int | None) -> tuple[np.ndarray, int]:
        """One K-FAC factor compressed, and its bits; rank None: quantized only."""
        if rank is None:
            return quantize(m, self.fisher_bits())
        return low_rank(m, rank, PAPER_FACTOR_BITS if self.kind == "paper" else self.fisher_bits())

    def apply(self, params: np.ndarray, stats: Any, spec: ParamSpec) -> tuple[np.ndarray, Any, int]:
        """(weights, Fisher, bits) as the server receives them; stats is a diagonal vector or a KFAC."""
        if self.kind == "none":
            raise ValueError("compression 'none' sends the raw floats; nothing to apply")
        weights, bits = quantize_per_tensor(params, spec, PAPER_WEIGHT_BITS)
        if isinstance(stats, KFAC):
            blocks: list[KFACBlock] = []
            diagonal: dict[str, np.ndarray] = {}
            for b in stats.blocks:
                (a, ba), (g, bg) = (self.factor(m, self._rank(m, stats, spec)) for m in (b.A, b.G))
                blocks.append(KFACBlock(b.layer, a, g))
                bits += ba + bg
            for name, v in stats.diagonal.items():  # the diagonal fallback (README) as Diag's Fisher: per tensor
                diagonal[name], bv = quantize(v, self.fisher_bits())
                bits += bv
            return weights, KFAC(blocks, diagonal), bits
        diag, diag_bits = quantize_per_tensor(stats, spec, self.fisher_bits())
        return weights, diag, bits + diag_bits

    def _rank(self, m: np.ndarray, kfac: KFAC, spec: ParamSpec) -> int | None:
        if self.kind == "paper":
            return paper_rank(kfac, spec.size)
        return max(int(len(m) // (2 * self.s_v)), 1) if self.s_v > 1 else None
