"""Flower's side of the peer benchmark: benchmarks/speed.py's FedAvg task on Flower's Simulation Engine.

It runs in a virtual environment of its own (`make bench-peers` builds `.venv-flower`), so only numpy
and torch are imported at the top and Flower inside `main`. raysim's benchmark writes the task file
(`write_task`): the pooled training rows and each client's indices into them (raysim's split), the
test set, raysim's initial weights, and for every round the clients FedAvg's plan selects with each
one's minibatches (row indices, -1 padding), and the server's evaluation (every `eval_every` rounds and
the last, train loss on `eval_rows`); benchmarks/pfl_peer.py reads the same file. The ClientApp trains
the client named in its message on those minibatches with torch.optim.SGD; Flower's own FedAvg
aggregates; the server evaluates the global model when raysim's does. Events go to stdout as
`speed {json}` lines: `ready` once the task is read, `begun` when round 1 is configured, `round` after
each round (with the metrics when the server evaluated), all with the epoch time.

Run: python benchmarks/flower_peer.py TASK.npz
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

EVENT_PREFIX = "speed "
CLIENT_CPUS = 1  # two ClientApp actors on a 2-CPU Ray, as raysim runs two client actors
RAY_CPUS = 2


@dataclass
class Task:
    """Everything a peer's run needs, as raysim made it. `selected[t - 1]` are round t's clients and
    `batches[t - 1][i]` the minibatches ([steps, batch] row indices of the client's own data, -1 pads)
    of `selected[t - 1][i]`. The server evaluates after every `eval_every`-th round and the last: test
    accuracy and loss, and the loss on the pooled training rows `eval_rows`."""

    train_x: np.ndarray
    train_y: np.ndarray
    client_rows: list[np.ndarray]
    test_x: np.ndarray
    test_y: np.ndarray
    names: list[str]
    init: list[np.ndarray]
    lr: float
    selected: list[np.ndarray]
    batches: list[np.ndarray]
    eval_rows: np.ndarray
    eval_every: int

    @property
    def num_clients(self) -> int:
        return len(self.client_rows)

    @property
    def rounds(self) -> int:
        return len(self.selected)

    def evaluates(self, round: int) -> bool:
        """Whether the server evaluates after `round` (1-based), as raysim's does."""
        return round % self.eval_every == 0 or round == self.rounds

    def client(self, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Client c's (x, y)."""
        rows = self.client_rows[c]
        return self.train_x[rows], self.train_y[rows]

    def plan(self, round: int, c: int) -> np.ndarray:
        """Client c's minibatches in `round` (1-based)."""
        i = int(np.flatnonzero(self.selected[round - 1] == c)[0])
        return self.batches[round - 1][i]


def write_task(path: Path, task: Task) -> None:
    """One .npz holding the task; lists become numbered keys."""
    arrays = {}
    for f in fields(Task):
        value = getattr(task, f.name)
        if isinstance(value, list) and f.name != "names":
            arrays[f"{f.name}_count"] = np.asarray(len(value))
            arrays.update({f"{f.name}_{i}": np.asarray(v) for i, v in enumerate(value)})
        else:
            arrays[f.name] = np.asarray(value)
    np.savez(path, **arrays)


def read_task(path: Path) -> Task:
    """The Task `write_task` wrote."""
    with np.load(path) as z:
        values = {}
        for f in fields(Task):
            if f"{f.name}_count" in z:
                values[f.name] = [z[f"{f.name}_{i}"] for i in range(int(z[f"{f.name}_count"]))]
            else:
                values[f.name] = z[f.name]
    values["names"] = [str(n) for n in values["names"]]
    values["lr"] = float(values["lr"])
    values["eval_every"] = int(values["eval_every"])
    return Task(**values)


def build_model(task: Task) -> nn.Module:
    """raysim's MLP (Flatten, then Linear layers with ReLU between), sized by the task's weights."""
    layers: list[nn.Module] = [nn.Flatten()]
    weights = [w for n, w in zip(task.names, task.init) if n.endswith(".weight")]
    for i, w in enumerate(weights):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(w.shape[1], w.shape[0]))
    model = nn.Sequential(*layers)
    model.load_state_dict(initial_state(task))  # strict: the names and shapes must be raysim's
    return model


def initial_state(task: Task) -> dict[str, torch.Tensor]:
    return {n: torch.from_numpy(np.array(w)) for n, w in zip(task.names, task.init)}


def train_client(model: nn.Module, state: dict[str, torch.Tensor], x: np.ndarray, y: np.ndarray,
                 batches: np.ndarray, lr: float) -> dict[str, torch.Tensor]:
    """The local loop: from the global `state`, one SGD step per minibatch, in the given order."""
    model.load_state_dict(state)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    for step in batches:
        rows = torch.from_numpy(step[step >= 0])
        if len(rows) == 0:
            continue
        opt.zero_grad()
        F.cross_entropy(model(x[rows]), y[rows]).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.state_dict().items()}


def evaluate(model: nn.Module, state: dict[str, torch.Tensor], task: Task) -> dict[str, float]:
    """What raysim's server reports: test accuracy and loss, and the loss on the pooled training rows it samples."""
    model.load_state_dict(state)
    with torch.no_grad():
        out = model(torch.from_numpy(task.test_x))
        test_y = torch.from_numpy(task.test_y)
        rows = torch.from_numpy(task.eval_rows)
        train_loss = F.cross_entropy(model(torch.from_numpy(task.train_x)[rows]), torch.from_numpy(task.train_y)[rows])
    return {"test_accuracy": float((out.argmax(1) == test_y).double().mean()),
            "test_loss": float(F.cross_entropy(out, test_y)), "train_loss": float(train_loss)}


def emit(event: str, **values) -> None:
    print(EVENT_PREFIX + json.dumps({"event": event, "t": time.time(), **values}), flush=True)


_CACHE: dict[str, tuple[Task, nn.Module]] = {}  # per ClientApp worker process: the task, read once


def _cached(path: str) -> tuple[Task, nn.Module]:
    if path not in _CACHE:
        torch.set_num_threads(1)
        task = read_task(Path(path))
        _CACHE[path] = (task, build_model(task))
    return _CACHE[path]


def client_train(msg, context):
    """The ClientApp's train handler: train the client the message names, reply with its weights and size."""
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    config = msg.content["config"]
    task, model = _cached(str(config["task"]))
    c, round = int(config["cid"]), int(config["server-round"])
    x, y = task.client(c)
    new = train_client(model, msg.content["arrays"].to_torch_state_dict(), x, y, task.plan(round, c), task.lr)
    reply = RecordDict({"arrays": ArrayRecord(new), "metrics": MetricRecord({"num-examples": len(y)})})
    return Message(reply, reply_to=msg)


def main(argv: list[str]) -> None:
    """Run the task on Flower's Simulation Engine (Ray backend): one supernode per client."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg
    from flwr.serverapp.strategy.strategy_utils import sample_nodes
    from flwr.simulation import run_simulation

    path = str(Path(argv[0]).resolve())
    torch.set_num_threads(1)
    task, model = _cached(path)

    class PlannedFedAvg(FedAvg):
        """Flower's FedAvg, training the clients raysim's plan selects for the round (client c on the c-th node)."""

        def configure_train(self, server_round, arrays, config, grid):
            if server_round == 1:
                emit("begun")
            nodes = sorted(sample_nodes(grid, task.num_clients, task.num_clients)[1])  # FedAvg's wait for every node
            return [Message(RecordDict({"arrays": arrays, "config": ConfigRecord(
                        {"server-round": server_round, "cid": int(c), "task": path})}),
                            dst_node_id=nodes[int(c)], message_type=MessageType.TRAIN)
                    for c in task.selected[server_round - 1]]

    def evaluate_fn(server_round, arrays):
        if server_round == 0:
            return None
        if not task.evaluates(server_round):
            emit("round", round=server_round)
            return None
        metrics = evaluate(model, arrays.to_torch_state_dict(), task)
        emit("round", round=server_round, **metrics)
        return MetricRecord(metrics)

    server = ServerApp()

    @server.main()
    def _(grid, context):
        PlannedFedAvg(fraction_evaluate=0.0).start(grid=grid, initial_arrays=ArrayRecord(initial_state(task)),
                                                   num_rounds=task.rounds, evaluate_fn=evaluate_fn)

    client = ClientApp()
    client.train()(client_train)
    emit("ready")
    run_simulation(server_app=server, client_app=client, num_supernodes=task.num_clients,
                   backend_config={"init_args": {"num_cpus": RAY_CPUS},
                                   "client_resources": {"num_cpus": CLIENT_CPUS, "num_gpus": 0.0}})


if __name__ == "__main__":
    import flower_peer  # the ClientApp's handler must live in an importable module for Ray's workers

    flower_peer.main(sys.argv[1:])
