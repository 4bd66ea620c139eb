"""The speed benchmark's references (benchmarks/speed.py) compute what raysim computes: the plain
torch loop and its torch.func vectorization agree on the parameters, and raysim's metrics after a
round equal theirs. The timings themselves are not tested."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import raysim
from raysim.config import load_config

TOL = 1e-5


def _load_benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "speed.py"
    spec = importlib.util.spec_from_file_location("speed_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


speed = _load_benchmark()


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Both references at 10 clients x 1 round: {system: (parameters, metrics)}."""
    cfg = load_config(speed.experiment(10, 1))
    work = tmp_path_factory.mktemp("speed")
    out = {}
    for system in ("sequential", "vectorized"):
        theta, metrics, _, _ = speed.run_reference(system, cfg, work / system)
        out[system] = (theta.numpy(), metrics)
    return out


def test_sequential_and_vectorized_references_give_the_same_parameters(references, tmp_path):
    seq, vec = references["sequential"][0], references["vectorized"][0]
    assert np.max(np.abs(seq - vec)) < TOL
    init = speed.Federation(load_config(speed.experiment(10, 1)), tmp_path / "data").algo.init().params
    assert np.max(np.abs(seq - init)) > 1e-3  # the round trained


def test_raysim_matches_the_references_after_one_round(tmp_path, references):
    row = raysim.run(speed.experiment(10, 1), out=tmp_path / "raysim", backend="local").rounds.iloc[-1]
    for system, (_, metrics) in references.items():
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert abs(row[key] - metrics[key]) <= TOL, (system, key, row[key], metrics[key])


def test_with_partial_participation_the_references_train_the_clients_raysim_selects(tmp_path):
    cfg = speed.experiment(10, 2, per_round=4)
    row = raysim.run(cfg, out=tmp_path / "raysim", backend="local").rounds.iloc[-1]
    assert row["selected"] == 4
    for system in ("sequential", "vectorized"):
        _, metrics, _, _ = speed.run_reference(system, load_config(cfg), tmp_path / system)
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert abs(row[key] - metrics[key]) <= TOL, (system, key, row[key], metrics[key])
