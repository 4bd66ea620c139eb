"""Taking the trained model out of a run (`raysim export`, `raysim.trained_model`): a state_dict that loads into
`build_model` of the run's model config and scores the test accuracy the run recorded, the best round's model
with --best, and arrays for a family without a torch model: all of them (a kernel representer model whole, nested
values under dotted names), or a one-line refusal."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import raysim
from raysim.algorithms.kernel.algorithm import KernelFedAvg, split_targets
from raysim.algorithms.kernel.kernels import make_kernel
from raysim.cli import main
from raysim.config import load_config
from raysim.data import read_table_arrays
from raysim.errors import ExportError
from raysim.models import build_model
from raysim.results.export import model_arrays

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

RUN = {
    "name": "export",
    "seed": 17,
    "data": {"source": "digits", "num_clients": 6},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "fedavg", "rounds": 6, "clients_per_round": 4, "lr": 0.1, "local_steps": 10, "batch_size": 10},
    "checkpoint": {"every": 2},
    "callbacks": [{"kind": "best_model", "metric": "test_accuracy"}],
}


def accuracy(module: torch.nn.Module, run_dir) -> float:
    """Test accuracy of `module` on the run's own test split."""
    x, y = read_table_arrays(run_dir / "data" / "test.parquet")
    with torch.no_grad():
        return float((module(torch.tensor(x)).argmax(1).numpy() == y).mean())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return raysim.run(RUN, out=tmp_path_factory.mktemp("export") / "run", backend="local")


def test_exported_state_dict_scores_the_runs_last_test_accuracy(run, tmp_path):
    assert main(["export", str(run.run_dir), "--out", str(tmp_path / "m.pt")]) == 0
    cfg = load_config(run.run_dir / "config.yaml")
    module = build_model(cfg.model, (64,), (1, 8, 8), 10)
    module.load_state_dict(torch.load(tmp_path / "m.pt"))
    assert accuracy(module, run.run_dir) == run.rounds["test_accuracy"].iloc[-1]
    assert accuracy(run.model(), run.run_dir) == run.rounds["test_accuracy"].iloc[-1]  # RunResult.model(): the module
    torch.manual_seed(0)  # the untrained weights, fixed whatever ran before in this process
    untrained = build_model(cfg.model, (64,), (1, 8, 8), 10)
    assert accuracy(untrained, run.run_dir) < run.rounds["test_accuracy"].iloc[-1] - 0.1


def test_an_out_that_is_a_directory_gets_the_model_file_inside(run, tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    assert main(["export", str(run.run_dir), "--out", str(folder)]) == 0
    assert [p.name for p in folder.iterdir()] == ["model.pt"]
    assert torch.load(folder / "model.pt").keys() == run.model().state_dict().keys()


def test_best_exports_the_best_round_not_the_last(run):
    best = json.loads((run.run_dir / "best_model" / "best.json").read_text())
    rounds = run.rounds.set_index("round")
    assert best["round"] == rounds["test_accuracy"].idxmax() < rounds.index.max()  # not the newest checkpoint's
    module = raysim.trained_model(run.run_dir, best=True)
    x, y = read_table_arrays(run.run_dir / "data" / "test.parquet")
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(module(torch.tensor(x)), torch.tensor(y)))
    assert loss == pytest.approx(rounds["test_loss"][best["round"]], rel=1e-5)
    assert accuracy(module, run.run_dir) == rounds["test_accuracy"].max()


def test_a_moved_run_still_exports(run, tmp_path):
    import shutil

    moved = shutil.copytree(run.run_dir, tmp_path / "moved")
    shutil.rmtree(run.run_dir / "data" / "clients", ignore_errors=True)
    assert json.loads((moved / "data" / "federated.json").read_text())["train_path"] == "train.parquet"
    assert accuracy(raysim.trained_model(moved), moved) == run.rounds["test_accuracy"].iloc[-1]


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory):
    """A short feature-form kernel FedAvg run (no torch model), checkpointed every round."""
    cfg = {"name": "kernel-export", "seed": 1,
           "data": {"source": "linear_regression", "num_clients": 4, "partition": {"kind": "natural"},
                    "options": {"sizes": [20], "dim": 5, "noise": 0.1}},
           "model": {"name": "logreg"},
           "algorithm": {"name": "kernel_fedavg", "rounds": 3, "clients_per_round": 4, "eta": 0.1},
           "checkpoint": {"every": 1}}
    return raysim.run(cfg, out=tmp_path_factory.mktemp("kernel-export") / "run", backend="local")


def test_a_family_without_a_torch_model_exports_its_arrays(kernel_run):
    run = kernel_run
    assert main(["export", str(run.run_dir)]) == 0
    arrays = np.load(run.run_dir / "model.npz")
    theta = raysim.trained_model(run.run_dir)["theta"]
    assert np.array_equal(arrays["theta"], theta) and theta.shape == (5,) and np.abs(theta).sum() > 0
    assert str(arrays["kernel.type"]) == "linear"


def test_a_representer_kernel_model_exports_whole_and_scores_the_runs_last_test_metrics(tmp_path):
    """configs/kernel/kernel_general.yaml (representer form, Sobolev kernel): the .npz, loaded without pickle,
    rebuilds the kernel and f = sum_p alpha_p k(., x_p), which scores the test MSE and error the run recorded."""
    run = raysim.run(CONFIGS / "kernel" / "kernel_general.yaml", {"algorithm.rounds": 4, "checkpoint.every": 2},
                     out=tmp_path / "run", backend="local")
    assert main(["export", str(run.run_dir)]) == 0
    with np.load(run.run_dir / "model.npz") as npz:
        arrays = dict(npz)
    supports, alpha = arrays["representer.supports"], arrays["representer.alpha"]
    assert list(arrays["representer.ids"]) == list(range(10)) and arrays["representer.sizes"].sum() == len(alpha)
    assert supports.shape == (len(alpha), 1) and np.abs(alpha).sum() > 0
    hyper = {k.removeprefix("kernel."): v.item() for k, v in arrays.items() if k.startswith("kernel.") and k != "kernel.type"}
    kernel = make_kernel(str(arrays["kernel.type"]), **hyper)
    x, y = read_table_arrays(run.run_dir / "data" / "test.parquet")
    response, truth = split_targets(y)
    pred = kernel.gram(x, supports) @ alpha
    last = run.rounds.iloc[-1]
    assert last["round"] == 4  # the round of the newest checkpoint, the one exported
    assert np.mean((pred - response) ** 2) == pytest.approx(last["test_mse"], rel=1e-12, abs=0)
    assert np.mean((pred - truth) ** 2) == pytest.approx(last["test_error"], rel=1e-12, abs=0)


@dataclass
class Block:
    """A nested value of a model: an array and a mapping of arrays."""

    w: np.ndarray
    parts: dict


def test_nested_values_are_flattened_to_dotted_names_and_objects_are_refused():
    arrays = model_arrays({"a": 1.5, "block": Block(np.arange(3), {0: torch.ones(2), "b": None}), "name": "rbf"}, "RUN")
    assert sorted(arrays) == ["a", "block.parts.0", "block.w", "name"]
    assert all(v.dtype != object for v in arrays.values()) and arrays["block.parts.0"].tolist() == [1.0, 1.0]
    for bad in ({"block": Block(np.arange(3), {"k": object()})}, {"ragged": [np.ones(2), np.ones(3)]}, np.ones(3)):
        with pytest.raises(ExportError, match="RUN"):
            model_arrays(bad, "RUN")


def test_a_model_that_is_not_all_arrays_is_refused_in_one_line_and_nothing_is_written(kernel_run, monkeypatch, capsys):
    export = KernelFedAvg.export
    monkeypatch.setattr(KernelFedAvg, "export", lambda self, state: {**export(self, state), "solver": object()})
    out = kernel_run.run_dir / "refused.npz"
    capsys.readouterr()
    assert main(["export", str(kernel_run.run_dir), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(kernel_run.run_dir) in err[0] and "'solver'" in err[0]
    assert not out.exists()


def test_a_run_without_checkpoints_is_refused_in_one_line(tmp_path, capsys):
    run = raysim.run({**RUN, "checkpoint": {"every": 0}, "callbacks": [], "algorithm": {**RUN["algorithm"], "rounds": 1}},
                     out=tmp_path / "run", backend="local")
    capsys.readouterr()  # the run's own progress lines, when an earlier test configured the raysim logger
    assert main(["export", str(run.run_dir)]) == 2
    assert main(["export", str(run.run_dir), "--best"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "checkpoint.every" in err[0] and "best_model" in err[1]
    assert not (run.run_dir / "model.pt").exists()
