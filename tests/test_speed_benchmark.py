"""The speed benchmark's references (benchmarks/speed.py) compute what raysim computes: the plain
torch loop and its torch.func vectorization agree on the parameters, and raysim's metrics after a
round equal theirs. Flower's side (benchmarks/flower_peer.py) reads raysim's split, initial weights,
clients and minibatches from the task file, and its client loop gives raysim's numbers; pfl's side
(benchmarks/pfl_peer.py) turns each client's minibatches into a dataset whose one pass in batches is
them. Flower and pfl themselves are not installed here (each has its own environment, `make
bench-peers`). The timings are not tested."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import raysim
from raysim.config import load_config
from raysim.data import build_federated, read_clients
from raysim.round.engine import eval_data

TOL = 1e-5


def _load_benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "speed.py"
    spec = importlib.util.spec_from_file_location("speed_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


speed = _load_benchmark()


def _load_pfl_peer():
    speed.load_flower_peer()  # pfl_peer imports the task format from flower_peer
    spec = importlib.util.spec_from_file_location("pfl_peer", speed.PFL_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def test_raysim_is_measured_again_in_the_same_work_directory(tmp_path):
    """`--repeats` runs raysim again where it ran: each run gets a directory of its own, none is overwritten."""
    cfg = load_config({**speed.experiment(10, 2), "backend": "local"})
    first, second = (speed.run_raysim(cfg, tmp_path)[0] for _ in range(2))
    assert first == second
    assert len(list(tmp_path.glob("raysim-*/run/run.json"))) == 2


def test_raysims_first_round_counts_from_round_1_begun(tmp_path):
    """The first round is round 1 alone: the start-up, and the runner's imports at the first `raysim.run` (0.26 s,
    once counted into round 1), belong to launch-to-round-1. It holds round 1's own wall time and its writing."""
    cfg = load_config({**speed.experiment(10, 2), "backend": "local"})
    _, _, info, first = speed.run_raysim(cfg, tmp_path)
    own = pd.read_parquet(next(tmp_path.glob("raysim-*/run/rounds.parquet")))["round_wall_s"].iloc[0]
    assert own <= first < info["startup_s"]


def test_with_partial_participation_the_references_train_the_clients_raysim_selects(tmp_path):
    cfg = speed.experiment(10, 2, per_round=4)
    row = raysim.run(cfg, out=tmp_path / "raysim", backend="local").rounds.iloc[-1]
    assert row["selected"] == 4
    for system in ("sequential", "vectorized"):
        _, metrics, _, _ = speed.run_reference(system, load_config(cfg), tmp_path / system)
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert abs(row[key] - metrics[key]) <= TOL, (system, key, row[key], metrics[key])


@pytest.fixture(scope="module")
def flower_case(tmp_path_factory):
    """raysim's run of 10 clients, 4 a round, 2 rounds (local backend) and the task file Flower's side reads."""
    cfg = speed.experiment(10, 2, per_round=4)
    work = tmp_path_factory.mktemp("peers")
    result = raysim.run(cfg, out=work / "raysim", backend="local")
    fed = speed.Federation(load_config(cfg), work / "data")
    peer = speed.load_flower_peer()
    peer.write_task(work / "task.npz", speed.peer_task(load_config(cfg), work / "task-data"))
    return result, fed, peer, peer.read_task(work / "task.npz")


def test_the_flower_task_holds_raysims_split_initial_weights_and_selection(flower_case):
    result, fed, peer, task = flower_case
    own = read_clients(result.run_dir / "data" / "train.parquet", range(10))
    assert task.num_clients == 10
    for c in range(10):
        x, y = task.client(c)
        assert np.array_equal(x, own[c][0]) and np.array_equal(y, own[c][1])
    model = peer.build_model(task)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy()
    assert np.array_equal(flat, fed.algo.init().params.astype(flat.dtype))
    assert task.rounds == 2
    for t in (1, 2):
        assert sorted(task.selected[t - 1]) == sorted(result.clients.query("round == @t").client_id)
        for c, plan in zip(fed.chosen(t), fed.plans(t, fed.chosen(t))):
            steps = task.plan(t, int(c))
            assert [list(s[s >= 0]) for s in steps if (s >= 0).any()] == [list(i[w > 0]) for i, w in zip(plan.idx, plan.w)]


def test_the_flower_client_loop_gives_raysims_rounds(flower_case):
    """Each selected client trained by the Flower ClientApp's loop, averaged by samples as Flower's FedAvg
    does, then evaluated by its server: raysim's metrics, round after round."""
    result, _, peer, task = flower_case
    model = peer.build_model(task)
    state = peer.initial_state(task)
    for t in (1, 2):
        chosen = task.selected[t - 1]
        sizes = np.array([len(task.client(int(c))[1]) for c in chosen], dtype=np.float64)
        trained = [peer.train_client(model, state, *task.client(int(c)), task.plan(t, int(c)), task.lr) for c in chosen]
        state = {n: sum(float(w / sizes.sum()) * s[n] for w, s in zip(sizes, trained)) for n in state}
        metrics = peer.evaluate(model, state, task)
        row = result.rounds.query("round == @t").iloc[0]
        for key in ("test_accuracy", "test_loss", "train_loss"):
            assert abs(row[key] - metrics[key]) <= TOL, (t, key, row[key], metrics[key])


def test_pfls_datasets_iterate_raysims_minibatches(flower_case):
    """pfl_peer lays a client's rows out in the order of its minibatches and iterates them step by step: exactly
    raysim's minibatches (a pass over the data may end in a short batch and the next go on)."""
    _, fed, _, task = flower_case
    pfl_peer = _load_pfl_peer()
    assert pfl_peer.batch_width(task) == 10
    for t in (1, 2):
        for i, (c, plan) in enumerate(zip(fed.chosen(t), fed.plans(t, fed.chosen(t)))):
            rows, steps = pfl_peer.minibatches(task.batches[t - 1][i])
            assert len(rows) == fed.sizes[c]  # one epoch: each sample once
            bounds = np.cumsum([0, *steps])
            assert [list(rows[a:b]) for a, b in zip(bounds, bounds[1:])] == \
                [list(idx[w > 0]) for idx, w in zip(plan.idx, plan.w) if (w > 0).any()]
    rows, steps = pfl_peer.minibatches(np.array([[4, 2, 0, 1, 3], [5, 6, 7, -1, -1], [1, 0, 6, 2, 5]]))
    assert list(rows) == [4, 2, 0, 1, 3, 5, 6, 7, 1, 0, 6, 2, 5] and steps == (5, 3, 5)


def test_the_peer_task_evaluates_on_raysims_schedule_and_training_sample(tmp_path):
    cfg = load_config({**speed.experiment(10, 3), "eval": {"every": 2, "train_samples": 300}})
    task = speed.peer_task(cfg, tmp_path / "task")
    fed = build_federated(cfg.data, cfg.seed, tmp_path / "raysim")
    own = eval_data(fed, torch.float32, cfg.eval.train_samples, cfg.seed)
    assert len(task.eval_rows) == 300
    assert np.array_equal(task.train_x[task.eval_rows], own.train_x.numpy())
    assert np.array_equal(task.train_y[task.eval_rows], own.train_y.numpy())
    assert [task.evaluates(t) for t in (1, 2, 3)] == [False, True, True]
