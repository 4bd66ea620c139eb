"""pfl's side of the peer benchmark: a task raysim exported (benchmarks/flower_peer.py's Task) on Apple's pfl-research.

It runs in a virtual environment of its own (`make bench-peers` builds `.venv-pfl`), so only numpy, torch and the
task format are imported at the top and pfl inside `main`. The simulation is pfl's own, as its documentation
writes one: `FederatedAveraging` with a `PyTorchModel` (local `torch.optim.SGD` at the task's rate, central
`torch.optim.SGD` at rate 1.0 on the averaged update: FedAvg), a `SimulatedBackend` weighting each client by its
data points (`WeightByDatapoints`), in-memory user datasets (pfl's `Dataset` of tensors, the fastest kind when the
data fits in RAM) drawn from a `FederatedDataset`, and central evaluation (`CentralEvaluationCallback`, whole-set
batches, sharded over the workers, on raysim's schedule) of test accuracy and loss and of the loss on the task's
training rows.

The task is raysim's, not pfl's sampling: the user sampler yields raysim's selected clients round after round (user
id (round, position)), and a client's dataset holds its rows in the order of raysim's minibatches and iterates them
in those minibatches (`minibatches`: raysim's plans may end a pass over the data with a short batch and go on, which
pfl's fixed-size slicing cannot express), with the client's sample count as its length, so pfl's one local epoch
trains exactly raysim's steps and weighs the client as raysim does. pfl orders a cohort by data size, shares it out
among its workers and sums in its own order, so the model agrees with raysim's up to float rounding. Run it as
pfl's documentation runs a PyTorch simulation on N processes of one machine (benchmarks/speed.py's `pfl_command`):

    torchrun --standalone --nnodes=1 --nproc_per_node=2 benchmarks/pfl_peer.py TASK.npz
    python benchmarks/pfl_peer.py TASK.npz        # one process

Rank 0 prints benchmarks/flower_peer.py's event lines: `ready` once the task is read, `begun` as round 1 begins,
`round` after each round (with the metrics when the server evaluated).
"""
from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from flower_peer import Task, build_model, emit, read_task


def minibatches(batches: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """A client's minibatches ([steps, batch] row indices, -1 pads) as its rows in step order, one flat array, and
    the number of rows of each step that has any."""
    counts = (batches >= 0).sum(1)
    return batches[batches >= 0], tuple(int(n) for n in counts[counts > 0])


def batch_width(task: Task) -> int:
    """The task's local batch size: its largest minibatch."""
    return max(int((b >= 0).sum(2).max()) for b in task.batches)


class Classifier(nn.Sequential):
    """raysim's model (flower_peer.build_model's layers and parameter names) with the `loss` and `metrics` that pfl's
    PyTorchModel calls: mean cross-entropy of a minibatch, and summed loss and correct predictions of a set."""

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor) -> dict:
        from pfl.metrics import Weighted

        out = self(x)
        return {"loss": Weighted(float(F.cross_entropy(out, y, reduction="sum")), len(y)),
                "accuracy": Weighted(float((out.argmax(1) == y).sum()), len(y))}


def main(argv: list[str]) -> None:
    """Run the task on pfl's simulation in this process (one of torchrun's workers, or the only one)."""
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByDatapoints
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.internal.ops.selector import get_default_framework_module
    from pfl.metrics import Metrics, StringMetricName
    from pfl.model.pytorch import PyTorchModel  # joins torchrun's process group

    torch.set_num_threads(1)
    task = read_task(Path(argv[0]))
    distributed = get_default_framework_module().distributed
    lead = distributed.global_rank == 0
    if lead:
        emit("ready")
    ids = [(t, i) for t in range(1, task.rounds + 1) for i in range(len(task.selected[t - 1]))]
    plans = {(t, i): minibatches(task.batches[t - 1][i]) for t, i in ids}
    cohort = {len(s) for s in task.selected}
    if len(cohort) != 1:
        raise ValueError("pfl draws a cohort of one size every round")
    train_x, train_y = torch.from_numpy(task.train_x), torch.from_numpy(task.train_y)

    class Planned(Dataset):
        """A client's rows in minibatch order, iterated in raysim's minibatches whatever the batch size asked (pfl's
        own iteration slices fixed-size batches), its length the client's sample count (what pfl weights by)."""

        def __init__(self, x: torch.Tensor, y: torch.Tensor, steps: tuple[int, ...], samples: int):
            super().__init__((x, y))
            self._steps, self._samples = steps, samples

        def __len__(self) -> int:
            return self._samples

        def iter(self, batch_size: int | None):  # noqa: A003 (pfl's name)
            x, y = self.raw_data
            for start, stop in itertools.pairwise([0, *itertools.accumulate(self._steps)]):
                yield [x[start:stop], y[start:stop]]

    def user_dataset(user: tuple[int, int]) -> Planned:
        """Round t's i-th client, with its minibatches of round t."""
        t, i = user
        own = task.client_rows[task.selected[t - 1][i]]
        rows, steps = plans[user]
        local = torch.from_numpy(own[rows])
        return Planned(train_x[local], train_y[local], steps, len(own))

    # pfl's docs: weights (a user's compute) only even out workers whose users differ; without them it deals the
    # cohort round-robin, which keeps raysim's selection where the cohort divides evenly among the workers
    weights = {u: len(rows) for u, (rows, _) in plans.items()}
    even = len(set(weights.values())) == 1 and next(iter(cohort)) % distributed.world_size == 0
    sampler = itertools.cycle(ids).__next__  # raysim's selection, round after round (pfl's cohort sampler reads ahead)
    training = FederatedDataset(user_dataset, sampler, user_id_to_weight=None if even else weights)

    class Central(CentralEvaluationCallback):
        """pfl's central evaluation (one batch, sharded over the workers) on raysim's schedule: after every
        `eval_every`-th round and the last, and not of the initial model (pfl's own runs every `frequency`-th
        round from the second on, and before round 1)."""

        def on_train_begin(self, *, model: PyTorchModel) -> Metrics:
            return Metrics()

        def after_central_iteration(self, aggregate_metrics: Metrics, model: PyTorchModel, *,
                                    central_iteration: int) -> tuple[bool, Metrics]:
            return self._eval(model) if task.evaluates(central_iteration + 1) else (False, Metrics())

    def central(x: torch.Tensor, y: torch.Tensor, name: str) -> Central:
        """Central evaluation of (x, y), its metrics named `name ...`."""
        return Central(Dataset((x, y)), format_fn=lambda n: StringMetricName(f"{name} {n}"))

    class Events(TrainingProcessCallback):
        """Rank 0's event lines for benchmarks/speed.py; last among the callbacks, so a round's line comes after its
        evaluation."""

        def on_train_begin(self, *, model: PyTorchModel) -> Metrics:
            if lead:
                emit("begun")
            return Metrics()

        def after_central_iteration(self, aggregate_metrics: Metrics, model: PyTorchModel, *,
                                    central_iteration: int) -> tuple[bool, Metrics]:
            if lead:
                names = {"test_accuracy": "test accuracy", "test_loss": "test loss", "train_loss": "train loss"}
                emit("round", round=central_iteration + 1, **{k: float(aggregate_metrics[v].overall_value)
                                                              for k, v in names.items() if v in aggregate_metrics})
            return False, Metrics()

    evaluation = torch.from_numpy(task.eval_rows)
    module = Classifier(*build_model(task))
    model = PyTorchModel(model=module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=training, val_data=training, postprocessors=[WeightByDatapoints()])
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(central_num_iterations=task.rounds, evaluation_frequency=task.rounds,
                                           train_cohort_size=cohort.pop(), val_cohort_size=0),
        backend=backend, model=model,
        model_train_params=NNTrainHyperParams(local_learning_rate=task.lr, local_num_epochs=1,
                                              local_batch_size=batch_width(task)),
        callbacks=[central(torch.from_numpy(task.test_x), torch.from_numpy(task.test_y), "test"),
                   central(train_x[evaluation], train_y[evaluation], "train"), Events()],
        send_metrics_to_platform=False)


if __name__ == "__main__":
    main(sys.argv[1:])
