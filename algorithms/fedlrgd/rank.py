"""Appendix C of the FedLRGD paper: the approximate rank of neural-network gradients.

At trained weights θ*, draw k test samples x^(i) and k perturbed parameters
θ^(j) = θ* + (‖θ*‖₁/p) g_j, g_j ~ N(0, I_p) (75); for each sampled coordinate q build the k x k matrix
M_q[i, j] = ∂f/∂θ_q(x^(i); θ^(j)) (76) and take its approximate rank, the fewest singular values
holding 90% of ‖M_q‖_F² (77). Only "non-trivial" weights |θ*_q| ≥ 0.005 are sampled (about 500),
and zero matrices are skipped. Everything is torch.func (vmap of grad over the samples).

`raysim rank CONFIG` trains the config's model through raysim (the run's last checkpoint holds θ*)
and writes `rank.parquet` and `rank.json` into the run directory, where `raysim report` finds them.
`load_mnist` / `load_cifar10` read the datasets' own files (IDX, python pickles) for the paper's
networks (`sigmoid_mlp`, `sigmoid_cnn` in raysim.algorithms.fedlrgd.nets).
"""
from __future__ import annotations

import gzip
import json
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from raysim.core.rng import SERVER, SETUP, torch_stream
from raysim.models import ParamSpec
from raysim.storage.atomic import atomic_write_bytes, write_text

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
RANK_FILE, SUMMARY_FILE = "rank.parquet", "rank.json"


def approximate_rank(M: torch.Tensor, energy: float = 0.9) -> torch.Tensor:
    """min{J : Σ_{i≤J} σ_i² ≥ energy · ‖M‖_F²} of each matrix in M (..., k, k) (77); 0 for a zero matrix."""
    s2 = torch.linalg.svdvals(M.to(torch.float64)) ** 2
    cum = s2.cumsum(-1)
    total = cum[..., -1:]
    return torch.where(total[..., 0] > 0, (cum < energy * total).sum(-1) + 1, torch.zeros_like(total[..., 0], dtype=torch.long))


def perturbed_parameters(theta: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """k parameter vectors θ* + (‖θ*‖₁/p) g_j with g_j ~ N(0, I_p) (75), shape (k, p)."""
    noise = torch.randn((k, theta.numel()), generator=generator, dtype=theta.dtype)
    return theta + theta.abs().mean() * noise


def gradient_tensor(loss: Loss, thetas: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                    coords: torch.Tensor) -> torch.Tensor:
    """M[q, i, j] = ∂loss/∂θ_coords[q] (x_i, y_i; thetas[j]), shape (len(coords), n_x, n_theta) (76).

    One vmap over the samples per parameter vector, keeping only the sampled coordinates.
    """
    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
    cols = [per_sample(theta, x, y)[:, coords] for theta in thetas]  # each (n_x, len(coords))
    return torch.stack(cols, dim=-1).permute(1, 0, 2)


@dataclass
class RankSummary:
    """What the histogram says: how many coordinates, the share with rank ≤ 5 and ≤ 10, the median."""

    k: int
    coordinates: int
    share_le_5: float
    share_le_10: float
    median: float
    mean: float
    max: int


def summarize(ranks: np.ndarray, k: int) -> RankSummary:
    ranks = np.asarray(ranks)
    return RankSummary(k, int(ranks.size), float(np.mean(ranks <= 5)), float(np.mean(ranks <= 10)),
                       float(np.median(ranks)), float(np.mean(ranks)), int(ranks.max()))


def measure_ranks(loss: Loss, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, k: int, seed: int,
                  num_coords: int = 500, threshold: float = 0.005, energy: float = 0.9) -> pd.DataFrame:
    """Approximate ranks of ~`num_coords` sampled non-trivial coordinates (|θ*_q| ≥ threshold; 0: all).

    k of the samples (x, y) are drawn uniformly; the draws come from torch streams keyed by `seed`.
    Returns one row per coordinate with a non-zero matrix: coord, weight, rank, k.
    """
    if k > len(y):
        raise ValueError(f"k: {k} samples requested, only {len(y)} available")
    gen = torch_stream(seed, SETUP, SERVER, "rank")
    theta = theta.detach().to(torch.float64)
    eligible = torch.nonzero(theta.abs() >= threshold).flatten()
    if eligible.numel() == 0:
        raise ValueError(f"threshold: no weight has |theta| >= {threshold}")
    coords = eligible[torch.randperm(eligible.numel(), generator=gen)[:num_coords]].sort().values
    rows = torch.randperm(len(y), generator=gen)[:k]
    thetas = perturbed_parameters(theta, k, gen)
    M = gradient_tensor(loss, thetas, x[rows].to(torch.float64), y[rows], coords)
    ranks = approximate_rank(M, energy)
    keep = ranks > 0
    return pd.DataFrame({"coord": coords[keep].numpy(), "weight": theta[coords[keep]].numpy(),
                         "rank": ranks[keep].numpy(), "k": k})


def cross_entropy_loss(module: nn.Module) -> Loss:
    """Per-sample cross-entropy of `module` as a function of its flat parameter vector (float64)."""
    spec = ParamSpec.of(module)
    module = module.to(torch.float64)

    def loss(theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(module, spec.unflatten(theta), (x.unsqueeze(0),))
        return F.cross_entropy(out, y.unsqueeze(0))

    return loss


# ----------------------------------------------------------------------------- through raysim


def rank_run(config: str | Path, out: str | Path, k: int = 30, overrides: list[str] | None = None,
             num_coords: int = 500, threshold: float = 0.005) -> RankSummary:
    """Train `config` through raysim into `out`, then measure App. C's ranks at the final weights on
    the run's test set; writes rank.parquet and rank.json into `out`."""
    from raysim.storage import checkpoint
    from raysim.config import load_config
    from raysim.data import load_source, read_table_arrays
    from raysim.models import build_model
    from raysim.runner import run

    cfg = load_config(config, overrides or [])
    if cfg.checkpoint.every == 0:
        raise ValueError("checkpoint.every: must be > 0; the rank measurement reads θ* from the last checkpoint")
    result = run(cfg, out=out)
    found = checkpoint.latest(result.run_dir)
    if found is None or found[0] != cfg.algorithm.rounds:
        raise RuntimeError(f"{result.run_dir}: no checkpoint of the last round to read the trained weights from")
    state, _ = checkpoint.load(found[1] / "server.pkl")
    src = load_source(cfg.data, cfg.seed)  # for the shapes the model was built with
    x, y = read_table_arrays(result.run_dir / "data" / "test.parquet")
    module = build_model(cfg.model, src.feature_shape, src.image_shape, src.num_classes)
    table = measure_ranks(cross_entropy_loss(module), torch.as_tensor(state.params),
                          torch.as_tensor(np.array(x)), torch.as_tensor(np.array(y)), k, cfg.seed, num_coords, threshold)
    return write_ranks(table, result.run_dir, k)


def write_ranks(table: pd.DataFrame, run_dir: Path, k: int) -> RankSummary:
    """Write the per-coordinate ranks and their summary into `run_dir`."""
    summary = summarize(table["rank"].to_numpy(), k)
    atomic_write_bytes(Path(run_dir) / RANK_FILE, lambda tmp: table.to_parquet(tmp, index=False))
    write_text(json.dumps(asdict(summary), indent=2), Path(run_dir) / SUMMARY_FILE)
    return summary


# ----------------------------------------------------------------------------- the paper's datasets


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST's format; optionally .gz): big-endian magic, dims, then unsigned bytes."""
    with _open(path) as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
        if (directory / name).exists():
            return directory / name
    raise FileNotFoundError(f"{directory}: no {stem}[.gz]")


def load_mnist(directory: str | Path, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """MNIST from its IDX files: pixels in [0, 1] as float32 (n, 784), int64 labels."""
    d, prefix = Path(directory), "train" if split == "train" else "t10k"
    x = read_idx(_find(d, f"{prefix}-images-idx3-ubyte"))
    y = read_idx(_find(d, f"{prefix}-labels-idx1-ubyte"))
    return (x.reshape(len(x), -1) / 255.0).astype(np.float32), y.astype(np.int64)


def load_cifar10(directory: str | Path, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 from its python pickles (cifar-10-batches-py): (n, 3072) float32 in [0, 1] (channel-major), int64 labels."""
    d = Path(directory)
    names = [f"data_batch_{i}" for i in range(1, 6)] if split == "train" else ["test_batch"]
    xs, ys = [], []
    for name in names:
        with open(d / name, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        xs.append(np.asarray(batch[b"data"], dtype=np.uint8))
        ys.append(np.asarray(batch[b"labels"], dtype=np.int64))
    return (np.concatenate(xs) / 255.0).astype(np.float32), np.concatenate(ys)


def train_centralized(module: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, batch_size: int = 200,
                      lr: float = 1e-3, seed: int = 0) -> torch.Tensor:
    """The paper's recipe (App. C): Adam on cross-entropy, batch 200; returns the flat trained weights."""
    gen = torch_stream(seed, SETUP, SERVER, "rank_train")
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    for _ in range(epochs):
        perm = torch.randperm(len(yt), generator=gen)
        for a in range(0, len(yt), batch_size):
            i = perm[a: a + batch_size]
            opt.zero_grad()
            F.cross_entropy(module(xt[i]), yt[i]).backward()
            opt.step()
    spec = ParamSpec.of(module)
    return spec.flatten(dict(module.named_parameters())).detach()
