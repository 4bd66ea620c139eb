"""The algorithm contract: plain dataclasses that travel between server and clients.

An algorithm (see `raysim.algorithms`) is a small class of pure methods over these types:
init, client_init, plan, step, aggregate, evaluate. It never touches Ray, clocks or global
RNGs, so the same code runs in a unit test and on a cluster.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from raysim.core.keys import Keys

if TYPE_CHECKING:
    from pydantic import BaseModel

    from raysim.config import ExperimentConfig


@dataclass
class Cost:
    """What one client step (or one server aggregation) cost, as the system model needs it.

    oracle_calls: per-sample gradients or function queries made (the paper's unit).
    oracle_batches: minibatch steps made (`unit: batch` counts these instead).
    upload_vectors: uploads in units of one model-sized vector (a sketch of b of d numbers is b/d).
    upload_bytes: bytes actually uploaded.
    """

    oracle_calls: int = 0
    oracle_batches: int = 0
    upload_vectors: float = 0.0
    upload_bytes: int = 0


@dataclass
class Costs:
    """The costs of several clients' steps as columns (the fields of `Cost`, one entry per client): what a round
    books without a Python object per client."""

    oracle_calls: np.ndarray
    oracle_batches: np.ndarray
    upload_vectors: np.ndarray
    upload_bytes: np.ndarray

    @classmethod
    def of(cls, costs: list[Cost]) -> Costs:
        """The columns of a list of per-client costs."""
        return cls(np.array([c.oracle_calls for c in costs], dtype=np.int64),
                   np.array([c.oracle_batches for c in costs], dtype=np.int64),
                   np.array([c.upload_vectors for c in costs], dtype=np.float64),
                   np.array([c.upload_bytes for c in costs], dtype=np.int64))

    @classmethod
    def concat(cls, parts: list[Costs]) -> Costs:
        """Several clients' columns, one after the other."""
        if not parts:
            return cls.of([])
        return cls(*(np.concatenate([getattr(c, f.name) for c in parts]) for f in dataclasses.fields(cls)))

    def take(self, index: np.ndarray | slice) -> Costs:
        """The clients at `index` (an integer array or a boolean mask)."""
        return Costs(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))

    def cost(self, i: int) -> Cost:
        """Client i's cost as a `Cost`."""
        return Cost(int(self.oracle_calls[i]), int(self.oracle_batches[i]), float(self.upload_vectors[i]),
                    int(self.upload_bytes[i]))

    def __len__(self) -> int:
        return len(self.oracle_calls)


def as_costs(costs: Costs | list[Cost]) -> Costs:
    """Costs as columns, whether given as columns or as a list of per-client `Cost`s."""
    return costs if isinstance(costs, Costs) else Costs.of(list(costs))


@dataclass
class Plan:
    """What the server asks of one round: which clients take part and what they receive.

    `broadcast` is put in the object store once and shared by reference by every client actor.
    An empty `clients` array is a server-only round (the paper's Type B epoch). `phase` names the
    round's kind for multi-phase algorithms and is recorded in rounds.parquet.
    """

    clients: np.ndarray
    broadcast: Any = None
    phase: str = "train"


@dataclass
class Context:
    """What an algorithm knows of the experiment when it initialises.

    `model` is the model config, `num_clients` the federation size, `client_sizes` the number
    of samples of each client, `seed` the experiment seed, `params` the algorithm's own
    hyperparameters (validated by its `Params` class), `clients_per_round` how many clients the
    server selects (over-selection included) and `rounds` how many rounds the run has.
    """

    seed: int
    rounds: int
    clients_per_round: int
    num_clients: int
    client_sizes: np.ndarray
    feature_shape: tuple[int, ...]
    image_shape: tuple[int, ...] | None
    num_classes: int
    model: Any
    params: Any
    device: str = "cpu"
    train_path: str | Path | None = None  # the pooled training Parquet, for server-side data (e.g. FedLRGD's r samples)
    target_shape: tuple[int, ...] = ()  # per-sample target shape of a regression source (num_classes 0)
    partition_seed: int | None = None  # data.partition_seed: fixes the data across experiment seeds
    privacy: Any = None  # the `privacy:` section (PrivacyConfig) when the run is differentially private
    kept_per_round: int = 0  # the clients kept a round (algorithm.clients_per_round): DP-FedAvg's denominator

    @property
    def data_seed(self) -> int:
        """The seed of the data split and of server-side samples drawn from it (`DataConfig.split_seed`)."""
        return self.seed if self.partition_seed is None else self.partition_seed


@dataclass
class ClientData:
    """One client's local training data as tensors (features in the model's dtype; int64 labels or float targets)."""

    client_id: int
    x: Any
    y: Any

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class ClientBatch:
    """Several clients' local data in one block of rows: client `ids[i]` holds rows `starts[i]` to
    `starts[i] + sizes[i]` of `x` and `y` (a shard's whole block: nothing is copied). A shard hands its round's
    clients to `Algorithm.step_batch` as one of these, not as a ClientData each."""

    ids: np.ndarray
    starts: np.ndarray
    sizes: np.ndarray
    x: Any
    y: Any

    @classmethod
    def of(cls, datas: list[ClientData]) -> ClientBatch:
        """One block of the clients `datas` (their rows concatenated)."""
        import torch

        sizes = np.array([len(d) for d in datas], dtype=np.int64)
        return cls(np.array([d.client_id for d in datas], dtype=np.int64), np.cumsum(sizes) - sizes, sizes,
                   torch.cat([d.x for d in datas]), torch.cat([d.y for d in datas]))

    def client(self, i: int) -> ClientData:
        """Client i's data as a ClientData (a view)."""
        a = int(self.starts[i])
        return ClientData(int(self.ids[i]), self.x[a:a + int(self.sizes[i])], self.y[a:a + int(self.sizes[i])])

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Steps:
    """What `Algorithm.step_batch` returns for k clients: their replies stacked (one reply whose fields carry a
    leading client axis), their new states (None: the algorithm keeps no client state) and their costs."""

    replies: Any
    states: list[Any] | None
    costs: Costs


@dataclass
class EvalData:
    """What the server evaluates on: the held-out test set and (a sample of) the pooled training set."""

    test_x: Any
    test_y: Any
    train_x: Any
    train_y: Any

    def to(self, device: Any) -> EvalData:
        """The same data on `device` (its tensors themselves where they already are there)."""
        return EvalData(*(t.to(device) if hasattr(t, "to") else t
                          for t in (self.test_x, self.test_y, self.train_x, self.train_y)))


class Algorithm:
    """Base of every algorithm family; subclasses override the pure methods of the contract.

    The instance holds the experiment `Context` and nothing mutable: all state lives in the
    ServerState / ClientState values the methods take and return, so actors can checkpoint,
    restart and resume them.
    """

    Params: ClassVar[type[BaseModel] | None] = None  # pydantic model of the hyperparameters, set by each family
    name: ClassVar[str]  # the name it is registered under (`register_algorithm`)
    reducible: bool = False  # True when `reduce` pre-sums replies inside a shard

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.params = ctx.params

    @classmethod
    def config_problems(cls, params: Any, cfg: ExperimentConfig) -> list[str]:
        """What is wrong with running this algorithm (hyperparameters `params`) in experiment `cfg`, as
        `field: problem` lines; checked once, in the driver, before anything starts. Nothing by default."""
        return []

    def init(self) -> Any:
        """The initial ServerState."""
        raise NotImplementedError

    def client_init(self, client: int) -> Any:
        """A client's persistent ClientState before its first round (None: stateless clients)."""
        return None

    def plan(self, state: Any, round: int, rng: np.random.Generator) -> Plan:
        """Which clients take part in `round`, and the broadcast they receive."""
        raise NotImplementedError

    def step(self, cstate: Any, data: ClientData, broadcast: Any, rng: np.random.Generator) -> tuple[Any, Any, Cost]:
        """One client's work in a round: (Reply, new ClientState, Cost)."""
        raise NotImplementedError

    def step_many(self, cstates: list[Any], datas: list[ClientData], broadcast: Any,
                  rngs: list[np.random.Generator]) -> list[tuple[Any, Any, Cost]]:
        """The step of several clients at once; families that vectorize override this."""
        return [self.step(c, d, broadcast, r) for c, d, r in zip(cstates, datas, rngs)]

    def step_batch(self, cstates: list[Any] | None, batch: ClientBatch, broadcast: Any, keys: Keys) -> Steps:
        """The step of a shard's clients as one computation, with no Python object per client: `keys` gives every
        client's random draws at once (`keys.uniforms`), and the replies come back stacked, to be pre-reduced
        by fieldwise sums along the fixed tree (which must equal `reduce` of two replies). `cstates` is None when
        `client_init` gives None. Families that define it must give the numbers of `step` client by client;
        those that do not keep the per-client form. A shard on the CPU runs it on several threads at once, each
        over its own chunk of the clients (the instance holds nothing mutable, so they share it)."""
        raise NotImplementedError

    def reduce(self, replies: list[Any]) -> Any:
        """Pre-reduce replies inside a shard (only called when `reducible`); must be associative."""
        raise NotImplementedError

    def aggregate(self, state: Any, replies: list[Any], rng: np.random.Generator) -> tuple[Any, Cost]:
        """The new ServerState from the round's (possibly pre-reduced) replies, and the server's Cost."""
        raise NotImplementedError

    def plan_costs(self, clients: np.ndarray, keys: Keys) -> Costs:
        """The Costs the clients' steps will have (`keys` their step keys), known before they train: the buffered
        and async schedules time a client when it starts, and train later, together with every client that starts
        from the same model. The steps' own Costs are checked against it."""
        raise NotImplementedError

    def stale(self, reply: Any, weight: float, sent: Any, now: Any, mix: bool) -> Any:
        """A reply as the server applies it under the buffered and async schedules: scaled by `weight` (the
        staleness function, FedAsync's alpha included) and, with `mix` (FedAsync), re-based from the ServerState
        `sent` it was trained from to `now`, so that aggregating it alone mixes the client's model into the current
        one: theta_now + weight * (theta_sent + delta - theta_now)."""
        raise NotImplementedError

    @classmethod
    def schedulable(cls) -> bool:
        """Whether this algorithm runs under the buffered and async schedules: it is reducible and defines
        `plan_costs` and `stale`, and no subclass below the class that defines them redefines the steps or the
        reduction (whose Costs and replies those describe)."""
        mro = cls.__mro__

        def owner(name: str) -> type:
            return next(c for c in mro if name in c.__dict__)

        defined = [owner("plan_costs"), owner("stale")]
        return bool(cls.reducible) and Algorithm not in defined and all(
            issubclass(d, owner(n)) for d in defined for n in ("step", "step_many", "step_batch", "reduce"))

    def evaluate(self, state: Any, data: EvalData) -> dict[str, float]:
        """Metrics of the current ServerState."""
        return {}

    def round_metrics(self, state: Any, round: int) -> dict[str, float]:
        """Metrics of every round that need no evaluation (the privacy spent so far, say); none by default."""
        return {}

    def eval_payload(self, state: Any) -> Any:
        """What the server sends the clients' actors for federated evaluation (`eval.clients`): the global model."""
        raise NotImplementedError

    def evaluate_clients(self, payload: Any, cstates: list[Any] | None, batch: ClientBatch) -> dict[str, np.ndarray]:
        """Federated evaluation: metric columns [k] of the model in `payload` on each client's own rows in `batch`
        (`cstates`, their client states, for personalized models; None when `client_init` gives None). A client's
        numbers must not depend on which clients share the batch."""
        raise NotImplementedError

    @classmethod
    def metric_names(cls, cfg: ExperimentConfig) -> frozenset[str] | None:
        """The metrics `evaluate` and `round_metrics` can give in experiment `cfg`, checked against the callbacks'
        `metric` before the run; None (the default): not declared, a misspelled metric is found at the first
        evaluated round instead."""
        return None

    @classmethod
    def evaluates_clients(cls) -> bool:
        """Whether this algorithm defines federated evaluation (`evaluate_clients` and `eval_payload`)."""
        return cls.evaluate_clients is not Algorithm.evaluate_clients and cls.eval_payload is not Algorithm.eval_payload

    def export(self, state: Any) -> Any:
        """The trained model of a ServerState, for `raysim export`: an `nn.Module` (torch families) or a
        {name: array} mapping (saved as .npz; nested mappings and dataclasses are flattened to dotted names, and
        a value that is no array is refused, see `raysim.results.export.model_arrays`). By default the state's fields,
        all of them, if it is a dataclass: none is dropped, so a field the .npz cannot hold is refused rather than
        left out of the file."""
        if dataclasses.is_dataclass(state) and not isinstance(state, type) and dataclasses.fields(state):
            return {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
        raise NotImplementedError(f"{type(self).__name__} defines no export of its server state")


def batched(algorithm: Algorithm) -> bool:
    """Whether `algorithm` steps a shard's clients through `step_batch`: it defines one, and no subclass below the
    class that does redefines the per-client step or the reduction (whose numbers step_batch must give)."""
    mro = type(algorithm).__mro__

    def owner(name: str) -> type:
        return next(c for c in mro if name in c.__dict__)

    defined = owner("step_batch")
    return defined is not Algorithm and all(issubclass(defined, owner(n)) for n in ("step", "step_many", "reduce"))
