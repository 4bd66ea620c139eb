"""On a GPU (skipped without one): a run on the GPU repeats its numbers, bit for bit, run after run, on either
backend and any packing of its clients into GPU actors, evaluates on the GPU, and agrees with the CPU's run to
float32 rounding."""
import numpy as np
import pandas as pd
import pytest
import torch

import raysim
from raysim.results.tables import reproducible

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CFG = {  # an MLP 20-64-10 on Synthetic(1, 1): 400 clients, 100 a round, 5 local steps of batch 5
    "name": "gpu", "seed": 3, "backend": "local",
    "data": {"source": "synthetic", "num_clients": 400, "partition": {"kind": "natural"},
             "synthetic_samples": 8000, "synthetic_features": 20},
    "model": {"name": "mlp", "hidden": [64], "device": "cuda"},
    "algorithm": {"name": "fedavg", "rounds": 6, "clients_per_round": 100, "lr": 0.05, "local_steps": 5, "batch_size": 5},
    "eval": {"every": 3}, "checkpoint": {"every": 0},
}


def _same(a, b) -> None:
    pd.testing.assert_frame_equal(reproducible(a.rounds), reproducible(b.rounds))
    pd.testing.assert_frame_equal(reproducible(a.clients), reproducible(b.clients))


def test_a_gpu_run_repeats_its_numbers_and_evaluates_on_the_gpu(tmp_path):
    first, second = (raysim.run(CFG, out=tmp_path / name) for name in ("first", "second"))
    assert first.info["device"] == "cuda"
    _same(first, second)


def test_one_gpu_actor_or_two_and_the_local_backend_give_the_same_tables(ray_cluster, tmp_path):
    local = raysim.run(CFG, out=tmp_path / "local")
    runs = {n: raysim.run({**CFG, "backend": "ray", "cluster": {"num_actors": n, "driver_shard": False}},
                          out=tmp_path / f"ray{n}") for n in (1, 2)}
    for n, run in runs.items():
        assert run.info["actor_gpus"] == pytest.approx(1 / n, abs=1e-3) and run.info["server_device"] == "cuda"
        _same(local, run)


def test_the_gpu_agrees_with_the_cpu_to_float32_rounding(tmp_path):
    gpu = raysim.run(CFG, out=tmp_path / "gpu").rounds
    cpu = raysim.run(CFG, {"model.device": "cpu"}, out=tmp_path / "cpu").rounds
    for col in ("test_loss", "train_loss"):
        a, b = gpu[col].dropna().to_numpy(), cpu[col].dropna().to_numpy()
        print(f"{col}: largest relative difference GPU vs CPU {np.max(np.abs(a - b) / np.abs(b)):.2e}")
        np.testing.assert_allclose(a, b, rtol=1e-4)
    assert np.abs(gpu["test_accuracy"].dropna().to_numpy() - cpu["test_accuracy"].dropna().to_numpy()).max() <= 0.01
