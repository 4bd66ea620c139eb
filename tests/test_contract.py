"""The contract's columnar pieces: costs as columns, and which algorithms step a shard as one batch."""
import numpy as np

from raysim.contract import Algorithm, Cost, Costs, batched
from raysim.plugins import ALGORITHMS


def test_costs_are_the_columns_of_the_per_client_costs():
    costs = [Cost(10, 2, 0.5, 400), Cost(3, 1, 1.0, 800), Cost(0, 0, 0.0, 0)]
    columns = Costs.of(costs)
    assert [columns.cost(i) for i in range(3)] == costs
    assert [columns.take(np.array([2, 0])).cost(i) for i in range(2)] == [costs[2], costs[0]]
    joined = Costs.concat([columns, Costs.of(costs[:1])])
    assert len(joined) == 4 and joined.cost(3) == costs[0]
    assert joined.oracle_calls.dtype == np.int64 and joined.upload_vectors.dtype == np.float64
    assert len(Costs.concat([])) == 0


def test_an_algorithm_steps_as_a_batch_only_where_nothing_below_redefines_the_step():
    """FedAvg and its server optimizers batch; SCAFFOLD and sketching redefine step_many and keep the per-client
    form; so does a plugin that subclasses FedAvg and redefines its step or reduction."""
    import raysim.algorithms.fedavg  # noqa: F401  (registers the family)
    import raysim.algorithms.sketching  # noqa: F401

    def flag(name):
        return batched(object.__new__(ALGORITHMS.lookup(name)))

    assert flag("fedavg") and flag("fedprox") and flag("fedadam")
    assert not flag("scaffold") and not flag("sketching")
    fedavg = ALGORITHMS.lookup("fedavg")
    own_step = type("OwnStep", (fedavg,), {"step": lambda self, *a: None})
    own_reduce = type("OwnReduce", (fedavg,), {"reduce": lambda self, replies: None})
    assert not batched(object.__new__(own_step)) and not batched(object.__new__(own_reduce))
    assert not batched(object.__new__(type("Plain", (Algorithm,), {})))
