"""FedZO, ZO-FedProx and ZO-SCAFFOLD I/II: exact accounting, the corrections of eq. (2),
the official code's server acceptance option, and a run through the real runtime."""
import numpy as np
import pytest
import torch

import raysim
from raysim.algorithms.fzoos.family import ZOBroadcast
from raysim.algorithms.fzoos.fedzo import FedZO, ZOFedProx, ZOScaffold1, ZOScaffold2
from raysim.contract import ClientData, Context
from raysim.core.rng import SERVER, stream
from raysim.models import ModelConfig


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make(cls, num_clients=5, **params):
    ctx = Context(seed=1, rounds=1, clients_per_round=num_clients, num_clients=num_clients,
                  client_sizes=np.ones(num_clients), feature_shape=(1,), image_shape=None, num_classes=1,
                  model=ModelConfig(), params=cls.Params(**params))
    return cls(ctx)


def rounds(algo, n):
    """n raysim rounds in process: [(state, phase, client costs, server cost)]."""
    cstates = {c: algo.client_init(c) for c in range(algo.ctx.num_clients)}
    state, out = algo.init(), []
    for t in range(1, n + 1):
        plan = algo.plan(state, t, stream(1, t, SERVER, "plan"))
        replies, costs = [], []
        for c in plan.clients.tolist():
            reply, cstates[c], cost = algo.step(cstates[c], ClientData(c, None, None), plan.broadcast,
                                                stream(1, t, c, "step"))
            replies.append(reply)
            costs.append(cost)
        state, server = algo.aggregate(state, replies, None)
        out.append((state, plan.phase, costs, server))
    return out


@pytest.mark.parametrize("cls,phases,calls,floats", [
    (FedZO, ["local"], [211], [1]),
    (ZOFedProx, ["local"], [211], [1]),
    (ZOScaffold2, ["local"], [211], [2]),
    (ZOScaffold1, ["local", "control"], [211, 21], [1, 1]),
])
def test_queries_and_uploads_per_client_and_round(cls, phases, calls, floats):
    """At T = 10, Q = 20: 1 + T(Q + 1) = 211 a round; SCAFFOLD-I + (Q + 1) in a second phase
    (58,000 over N = 5, R = 50); uploads d floats (SCAFFOLD-II 2d)."""
    d = 12
    out = rounds(make(cls, objective={"dim": d}), 2 * len(phases))
    for i, (state, phase, costs, _) in enumerate(out):
        k = i % len(phases)
        assert phase == phases[k]
        assert [c.oracle_calls for c in costs] == [calls[k]] * 5
        assert all(c.upload_bytes == 8 * d * floats[k] and c.upload_vectors == floats[k] for c in costs)
    assert 5 * 50 * sum(calls) == {1: 52_750, 2: 58_000}[len(phases)]


def test_fedprox_correction_is_the_proximal_term():
    algo = make(ZOFedProx, objective={"dim": 4}, prox=0.7)
    x, b = torch.full((4,), 0.3, dtype=torch.float64), rounds(algo, 1)[0][0]
    assert torch.allclose(algo.correction(x, ZOBroadcast("local", b.x, None), None), 0.7 * (x - b.x))


def test_scaffold_control_variates_start_in_round_two_and_average():
    """No correction in round 1; SCAFFOLD-II's c is the mean of the clients' mean FD estimates."""
    out = rounds(make(ZOScaffold2, objective={"dim": 6}), 2)
    assert out[0][0].shared is not None and out[0][0].shared.shape == (6,)
    out1 = rounds(make(ZOScaffold1, objective={"dim": 6}), 2)
    assert out1[0][0].shared is None and out1[1][0].shared.shape == (6,)
    assert out1[0][0].zo_round == out1[1][0].zo_round == 1


def test_fedzo_descends_and_acceptance_step_is_monotone_and_charged():
    plain = rounds(make(FedZO, objective={"dim": 10}, lr=0.05), 8)
    algo = make(FedZO, objective={"dim": 10}, lr=0.05, server_accept_if_improves=True)
    accepted = rounds(algo, 8)
    values = [algo.objective.value(s.x) for s, *_ in accepted]
    assert all(b <= a for a, b in zip(values, values[1:]))
    assert all(server.oracle_calls == 5 for *_, server in accepted)
    assert algo.objective.value(plain[-1][0].x) < algo.objective.value(algo.init().x)


def test_fedzo_and_scaffold1_through_the_runtime(tmp_path):
    cfg = {"name": "fedzo-tiny", "seed": 2,
           "data": {"source": "blackbox", "num_clients": 3, "partition": {"kind": "natural"}},
           "algorithm": {"name": "zo_scaffold1", "rounds": 4, "clients_per_round": 3, "local_steps": 3,
                         "directions": 4, "objective": {"kind": "quadratic", "dim": 8}},
           "backend": "local"}
    result = raysim.run(cfg, out=tmp_path / "s1").rounds
    assert list(result["phase"]) == ["local", "control"] * 2
    assert result["oracle_calls"].iloc[-1] == 2 * 3 * ((1 + 3 * 5) + 5)
    assert result["objective"].iloc[-1] < result["objective"].iloc[0]
