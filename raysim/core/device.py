"""A CUDA device set up for repeatable numbers: the same seed gives the same numbers run after run on the same GPU."""
from __future__ import annotations

import os

import torch


def deterministic_cuda(tf32: bool) -> None:
    """Set this process up before its first CUDA kernel: TF32 off unless asked for (`model.tf32`), cuDNN's
    deterministic kernels and no autotuning (its choice varies run to run), and torch's deterministic algorithms
    (cuBLAS needs CUBLAS_WORKSPACE_CONFIG before its first call; an op with no deterministic form warns)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
