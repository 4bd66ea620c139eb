"""A GPU process is set up for repeatable numbers (TF32 off unless `model.tf32`, deterministic kernels). The flags are
torch's own on a CPU build too, so this checks the set-up itself; the GPU's numbers need a GPU."""
import os

import numpy as np
import pytest
import torch

import raysim
from raysim.core.device import as_rows, deterministic_cuda, host, process_device
from raysim.errors import ConfigError


@pytest.fixture
def restored():
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
             torch.utils.deterministic.fill_uninitialized_memory)
    yield
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic,
     torch.backends.cudnn.benchmark) = flags[:4]
    torch.use_deterministic_algorithms(flags[4], warn_only=flags[5])
    torch.utils.deterministic.fill_uninitialized_memory = flags[7]
    if flags[6] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


@pytest.mark.parametrize("tf32", [False, True])
def test_a_gpu_process_runs_deterministic_kernels_and_tf32_only_when_asked(restored, tf32):
    torch.backends.cudnn.benchmark = True
    deterministic_cuda(tf32)
    assert torch.backends.cuda.matmul.allow_tf32 is tf32 and torch.backends.cudnn.allow_tf32 is tf32
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.are_deterministic_algorithms_enabled() and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.utils.deterministic.fill_uninitialized_memory  # no fill kernel per allocation


def test_model_device_resolves_in_each_process(tmp_path):
    """cpu is the CPU everywhere; auto is the GPU where the process sees one; cuda without one is one clear error
    (and a run asked to leave no results directory)."""
    assert process_device("cpu", "here") == "cpu"
    gpu = torch.cuda.is_available()
    assert process_device("auto", "here") == ("cuda" if gpu else "cpu")
    if gpu:
        assert process_device("cuda", "here") == "cuda"
        return
    with pytest.raises(ConfigError, match=r"^model.device: cuda, but this test's process sees no CUDA device"):
        process_device("cuda", "this test's process")
    cfg = {"name": "nogpu", "data": {"source": "digits", "num_clients": 4}, "model": {"name": "logreg", "device": "cuda"},
           "algorithm": {"name": "fedavg", "rounds": 1, "clients_per_round": 2}, "backend": "local"}
    with pytest.raises(ConfigError, match="model.device: cuda, but the local backend's process sees no CUDA device"):
        raysim.run(cfg, out=tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_host_and_rows_keep_arrays_and_bring_tensors_home():
    a = np.arange(12.0).reshape(4, 3)
    t = torch.from_numpy(a)
    assert host(a) is a and isinstance(host(t), np.ndarray) and np.array_equal(host(t), a)
    mask = np.array([True, False, True, False])
    assert np.array_equal(as_rows(a, mask), a[mask]) and torch.equal(as_rows(t, mask), t[torch.from_numpy(mask)])
    assert torch.equal(as_rows(t, np.array([3, 0])), t[[3, 0]])
