"""A GPU process is set up for repeatable numbers (TF32 off unless `model.tf32`, deterministic kernels). The flags are
torch's own on a CPU build too, so this checks the set-up itself; the GPU's numbers need a GPU."""
import os

import pytest
import torch

from raysim.core.device import deterministic_cuda


@pytest.fixture
def restored():
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
     torch.backends.cudnn.benchmark) = flags[:4]
    torch.use_deterministic_algorithms(flags[4], warn_only=flags[5])
    if flags[6] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


@pytest.mark.parametrize("tf32", [False, True])
def test_a_gpu_process_runs_deterministic_kernels_and_tf32_only_when_asked(restored, tf32):
    torch.backends.cudnn.benchmark = True
    deterministic_cuda(tf32)
    assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
