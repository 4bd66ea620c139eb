"""The server's round on a real local Ray: stragglers dropped by deadline and over-selection,
the same drops whatever the actor layout, and `clock: real` really waiting for real stragglers."""
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

import raysim
from pydantic import BaseModel, ConfigDict

from raysim import Algorithm, Cost, Plan, register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.training import ServerState
from raysim.system import SystemModel
from raysim.config import load_config
from raysim.results import reproducible

CFG = {
    "name": "stragglers",
    "seed": 11,
    "data": {"source": "digits", "num_clients": 12},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg_counting", "rounds": 5, "clients_per_round": 8, "lr": 0.1,
                  "local_steps": 4, "batch_size": 5, "weighting": "uniform"},
    "system": {"compute": {"unit": "batch"}, "comm": {"phi": 2.0}},
    "cluster": {"num_actors": 2},
}


@dataclass
class CountingState(ServerState):
    aggregated: float = 0.0


@register_algorithm("fedavg_counting")
class FedAvgCounting(FedAvg):
    """FedAvg that reports how many client replies (uniform weight 1 each) it aggregated."""

    def init(self):
        return CountingState(super().init().params)

    def aggregate(self, state, replies, rng):
        new, cost = super().aggregate(state, replies, rng)
        return CountingState(new.params, float(sum(r.weight for r in replies))), cost

    def evaluate(self, state, data):
        return {**super().evaluate(state, data), "aggregated": state.aggregated}


def run(tmp_path, name, **overrides):
    result = raysim.run(CFG, out=tmp_path / name, **overrides)
    return result.rounds, result.clients


def test_deadline_drops_exactly_the_late_clients(ray_cluster, tmp_path):
    rounds, clients = run(tmp_path, "deadline", system__stragglers__deadline=8.0)
    np.testing.assert_array_equal(clients["dropped"], clients["compute_time"] > 8.0)
    assert clients["dropped"].any() and not clients["dropped"].all()
    kept = clients[~clients["dropped"]].groupby("round").size()
    np.testing.assert_array_equal(rounds["clients"], kept.reindex(rounds["round"], fill_value=0))
    np.testing.assert_array_equal(rounds["aggregated"], rounds["clients"])  # dropped replies not aggregated
    assert (clients.loc[clients["dropped"], "upload_bytes"] == 0).all()


def test_over_selection_keeps_the_first_k(ray_cluster, tmp_path):
    rounds, clients = run(tmp_path, "over", algorithm__clients_per_round=6, system__stragglers__over_select=3)
    assert (rounds["selected"] == 9).all() and (rounds["clients"] == 6).all()
    np.testing.assert_array_equal(rounds["aggregated"], 6)
    for _, r in clients.groupby("round"):
        assert r["dropped"].sum() == 3
        assert r.loc[~r["dropped"], "compute_time"].max() <= r.loc[r["dropped"], "compute_time"].min()


def test_same_seed_drops_the_same_clients_with_any_actor_count(ray_cluster, tmp_path):
    over = {"system__stragglers__deadline": 9.0, "system__stragglers__over_select": 2, "algorithm__clients_per_round": 6}
    _, one = run(tmp_path, "one", cluster__num_actors=1, **over)
    _, three = run(tmp_path, "three", cluster__num_actors=3, **over)
    key = ["round", "client_id"]
    pd.testing.assert_frame_equal(one.sort_values(key).reset_index(drop=True)[key + ["dropped", "compute_time"]],
                                  three.sort_values(key).reset_index(drop=True)[key + ["dropped", "compute_time"]])


def test_gamma_and_sim_time_in_results(ray_cluster, tmp_path):
    rounds, clients = run(tmp_path, "gamma", system__comm__phi=0.0)
    np.testing.assert_allclose(rounds["gamma"], 4 * np.arange(1, 6))  # phi = 0: b_t = 4 steps per round
    rounds, clients = run(tmp_path, "gamma2")
    np.testing.assert_allclose(rounds["gamma"], (4 + 2.0 * 8) * np.arange(1, 6))  # T (b + phi tau m)
    per_round = rounds["sim_time"].diff().fillna(rounds["sim_time"].iloc[0])
    np.testing.assert_allclose(per_round, rounds["round_sim_time"])
    for r, grp in clients.groupby("round"):
        assert rounds.set_index("round").loc[r, "round_sim_time"] == pytest.approx(grp["finish_time"].max())


def test_real_clock_waits_and_drops_real_stragglers(ray_cluster, tmp_path):
    scale, deadline = 0.1, 8.0
    rounds, clients = run(tmp_path, "real", system__clock__mode="real", system__clock__time_scale=scale,
                          system__stragglers__deadline=deadline, algorithm__rounds=3)
    cfg = load_config(CFG, {"system.stragglers.deadline": deadline})
    model = SystemModel(cfg.system, cfg.seed, 12)
    cost = Cost(oracle_calls=20, oracle_batches=4)
    sampled = {(r, c): model.client_compute_times(r, [c], [cost])[0] for r, c in zip(clients["round"], clients["client_id"])}
    late = {k for k, t in sampled.items() if t > deadline}
    dropped = set(zip(clients.loc[clients["dropped"], "round"], clients.loc[clients["dropped"], "client_id"]))
    assert late and late <= dropped  # every client that slept past the deadline was really dropped
    margin = 0.2 / scale  # 0.2 s of scheduling overhead allowed, in simulated units
    assert all(sampled[k] > deadline - margin for k in dropped)
    slow_rounds = {r for r, _ in late}
    assert all(rounds.set_index("round").loc[r, "round_wall_s"] >= deadline * scale for r in slow_rounds)
    np.testing.assert_array_equal(rounds["aggregated"], rounds["clients"])



class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


@register_algorithm("abc_epochs")
class ABCEpochs(Algorithm):
    """Cycles the paper's epoch types: B (server computes 5 calls), A (clients compute 3, upload), C (upload only)."""

    Params = NoParams

    def init(self):
        return 0

    def plan(self, state, round, rng):
        phase = "BAC"[(round - 1) % 3]
        clients = np.array([], dtype=np.int64) if phase == "B" else np.arange(self.ctx.clients_per_round)
        return Plan(clients, phase, phase)

    def step(self, cstate, data, broadcast, rng):
        calls = 3 if broadcast == "A" else 0
        return 1.0, cstate, Cost(oracle_calls=calls, oracle_batches=calls, upload_vectors=1.0, upload_bytes=8)

    def aggregate(self, state, replies, rng):
        server = 5 if not replies else 0
        return state + 1, Cost(oracle_calls=server, oracle_batches=server)


def test_epoch_types_fall_out_of_the_costs(ray_cluster, tmp_path):
    """Gamma per Definition 1 over B, A, C epochs: 5, 3 + phi*m, phi*m; phases add up in sim time."""
    phi, m = 2.0, 4
    result = raysim.run({"name": "abc", "data": {"source": "digits", "num_clients": 6},
                         "algorithm": {"name": "abc_epochs", "rounds": 6, "clients_per_round": m},
                         "system": {"comm": {"phi": phi}}, "cluster": {"num_actors": 2}}, out=tmp_path / "abc")
    rounds = result.rounds.set_index("round")
    assert list(rounds["phase"]) == list("BACBAC")
    step = [5, 3 + phi * m, phi * m] * 2
    np.testing.assert_allclose(rounds["gamma"], np.cumsum(step))
    np.testing.assert_array_equal(rounds["oracle_calls"], np.cumsum([5, 3 * m, 0] * 2))
    assert rounds.loc[1, "round_sim_time"] >= 5  # server: 5 * shift + Erlang(5)
    clients = result.clients
    c_rounds = clients[clients["round"] % 3 == 0]  # upload only: no compute, finish = upload completion
    assert (c_rounds["compute_time"] == 0).all() and (c_rounds["upload_time"] > 0).all()
    assert set(clients["round"]) == {2, 3, 5, 6}


@register_algorithm("fedavg_stateful")
class FedAvgStateful(FedAvg):
    """FedAvg whose clients damp their update by how often they took part before: results depend
    on persistent client state, so a restarted actor must get that state back exactly."""

    def client_init(self, client):
        return 0

    def step(self, cstate, data, broadcast, rng):
        reply, _, cost = super().step(None, data, broadcast, rng)
        reply.total = reply.total / (1 + cstate)
        return reply, cstate + 1, cost


STATEFUL = {**CFG, "name": "stateful", "checkpoint": {"every": 2},
            "algorithm": {**CFG["algorithm"], "name": "fedavg_stateful", "rounds": 6, "vectorize": False}}


@pytest.mark.parametrize("every", [2, pytest.param(0, marks=pytest.mark.slow)])
def test_a_killed_client_actor_is_restarted_and_the_run_is_unchanged(ray_cluster, tmp_path, every):
    """Actor 1 dies mid-round 5 (after the checkpoint of round 4, or with none: replay from round 1)."""
    cfg = {**STATEFUL, "checkpoint": {"every": every}}
    clean = raysim.run(cfg, out=tmp_path / "clean")
    faulty = raysim.run({**cfg, "faults": [{"round": 5, "actor": 1}]}, out=tmp_path / "faulty")
    assert faulty.rounds["actor_restarts"].tolist() == [0, 0, 0, 0, 1, 1]
    pd.testing.assert_frame_equal(reproducible(clean.rounds), reproducible(faulty.rounds))
    pd.testing.assert_frame_equal(reproducible(clean.clients), reproducible(faulty.clients))


def test_faults_are_validated_up_front(ray_cluster, tmp_path):
    with pytest.raises(ValueError, match="faults.0.round: 9 is after the last round"):
        load_config({**STATEFUL, "faults": [{"round": 9, "actor": 0}]})
    with pytest.raises(ValueError, match="faults: actor 5 does not exist"):
        raysim.run({**STATEFUL, "faults": [{"round": 1, "actor": 5}]}, out=tmp_path / "bad")
