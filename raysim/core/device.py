"""Where a process computes (`model.device`), set up on a GPU for repeatable numbers: the same seed gives the
same numbers run after run on the same GPU."""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from raysim.errors import ConfigError


def process_device(wanted: str, where: str) -> str:
    """`model.device` resolved in this process: cuda where asked (auto: where the process sees a CUDA device),
    cpu otherwise; `cuda` asked of a process without one is a config error naming `where`."""
    if wanted == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if wanted == "cuda":
        raise ConfigError(f"model.device: cuda, but {where} sees no CUDA device (torch.cuda.is_available() is False)")
    return "cpu"


def deterministic_cuda(tf32: bool) -> None:
    """Set this process up before its first CUDA kernel: TF32 off unless asked for (`model.tf32`), cuDNN's
    deterministic kernels and no autotuning (its choice varies run to run), and torch's deterministic algorithms
    (cuBLAS needs CUBLAS_WORKSPACE_CONFIG before its first call; an op with no deterministic form warns). Torch's
    debugging fill of every uninitialized tensor in that mode stays off: it is a kernel launch per allocation (a
    third of a GPU round's), and raysim reads no memory it has not written (tests/round/test_gpu.py repeats runs
    bit for bit)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]


def host(x: Any) -> Any:
    """A tensor as a NumPy array in host memory (one transfer from a GPU); anything else as it is."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


def as_rows(x: Any, index: np.ndarray) -> Any:
    """The rows `index` (ints or a mask) of an array or of a tensor where it lives."""
    return x[torch.as_tensor(index, device=x.device)] if isinstance(x, torch.Tensor) else x[index]
