"""The round engine through `backend: local`: stragglers dropped by deadline and over-selection, the
federated oracle complexity and simulated time of every round, and epoch types from the costs."""
import numpy as np
import torch
import pytest
from pydantic import BaseModel, ConfigDict

import raysim
from raysim import Algorithm, Cost, Plan, register_algorithm

from conftest import STRAGGLERS


def run(tmp_path, name, **overrides):
    result = raysim.run(STRAGGLERS, out=tmp_path / name, backend="local", **overrides)
    return result.rounds, result.clients


def test_deadline_drops_exactly_the_late_clients(tmp_path):
    rounds, clients = run(tmp_path, "deadline", system__stragglers__deadline=8.0)
    np.testing.assert_array_equal(clients["dropped"], clients["compute_time"] > 8.0)
    assert clients["dropped"].any() and not clients["dropped"].all()
    kept = clients[~clients["dropped"]].groupby("round").size()
    np.testing.assert_array_equal(rounds["clients"], kept.reindex(rounds["round"], fill_value=0))
    np.testing.assert_array_equal(rounds["aggregated"], rounds["clients"])  # dropped replies not aggregated
    assert (clients.loc[clients["dropped"], "upload_bytes"] == 0).all()


def test_over_selection_keeps_the_first_k(tmp_path):
    rounds, clients = run(tmp_path, "over", algorithm__clients_per_round=6, system__stragglers__over_select=3)
    assert (rounds["selected"] == 9).all() and (rounds["clients"] == 6).all()
    np.testing.assert_array_equal(rounds["aggregated"], 6)
    for _, r in clients.groupby("round"):
        assert r["dropped"].sum() == 3
        assert r.loc[~r["dropped"], "compute_time"].max() <= r.loc[r["dropped"], "compute_time"].min()
    # every selected client, dropped or not, received the broadcast: logreg's 64*10 + 10 float32 and the lr
    assert (clients["download_bytes"] == (64 * 10 + 10) * 4 + 8).all()
    np.testing.assert_array_equal(rounds["download_bytes"], 9 * 2608 * rounds["round"])


def test_gamma_and_sim_time_in_results(tmp_path):
    rounds, clients = run(tmp_path, "gamma", system__comm__phi=0.0)
    np.testing.assert_allclose(rounds["gamma"], 4 * np.arange(1, 6))  # phi = 0: b_t = 4 steps per round
    rounds, clients = run(tmp_path, "gamma2")
    np.testing.assert_allclose(rounds["gamma"], (4 + 2.0 * 8) * np.arange(1, 6))  # T (b + phi tau m)
    per_round = rounds["sim_time"].diff().fillna(rounds["sim_time"].iloc[0])
    np.testing.assert_allclose(per_round, rounds["round_sim_time"])
    for r, grp in clients.groupby("round"):
        assert rounds.set_index("round").loc[r, "round_sim_time"] == pytest.approx(grp["finish_time"].max())


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


def test_epoch_types_fall_out_of_the_costs(tmp_path):
    """Gamma per Definition 1 over B, A, C epochs: 5, 3 + phi*m, phi*m; phases add up in sim time."""
    phi, m = 2.0, 4
    result = raysim.run({"name": "abc", "data": {"source": "digits", "num_clients": 6},
                         "algorithm": {"name": "abc_epochs", "rounds": 6, "clients_per_round": m},
                         "system": {"comm": {"phi": phi}}, "backend": "local"}, out=tmp_path / "abc")
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


def test_shards_of_groups_the_round_by_host_in_the_rounds_order():
    from raysim.round.engine import shards_of

    ids = np.random.default_rng(0).permutation(100)[:37]
    expected: dict[int, list[int]] = {}
    for c in ids.tolist():
        expected.setdefault(c // 7, []).append(c)
    got = shards_of(ids, 7)
    assert {s: g.tolist() for s, g in got.items()} == expected and shards_of([], 7) == {}
    assert all(g.dtype == np.int64 for g in got.values())


def test_eval_test_samples_evaluates_a_fixed_seeded_sample_of_the_test_set(tmp_path):
    from raysim.config import load_config
    from raysim.data import build_federated, read_table_arrays
    from raysim.round.engine import eval_data

    cfg = load_config(STRAGGLERS)
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    tx, _ = read_table_arrays(fed.test_path)
    whole = eval_data(fed, torch.float32, 100, cfg.seed)
    some = eval_data(fed, torch.float32, 100, cfg.seed, test_samples=40)
    assert len(whole.test_x) == len(tx) > 40 and len(some.test_x) == 40
    rows = {r.tobytes() for r in tx}
    assert all(r.numpy().tobytes() in rows for r in some.test_x)  # rows of the test set, each once
    assert len({r.numpy().tobytes() for r in some.test_x}) == 40
    assert torch.equal(some.test_x, eval_data(fed, torch.float32, 100, cfg.seed, test_samples=40).test_x)
    assert torch.equal(whole.test_x, eval_data(fed, torch.float32, 100, cfg.seed, test_samples=len(tx)).test_x)
    rounds, _ = run(tmp_path, "sampled", eval__test_samples=40)
    assert rounds["test_accuracy"].mul(40).sub(rounds["test_accuracy"].mul(40).round()).abs().max() < 1e-9
