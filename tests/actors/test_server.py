"""The server actor on a real local Ray: `clock: real` really waiting for real stragglers, a killed
client actor restarted with its clients' state, and memory that stays flat over many rounds."""
import os
import time

import numpy as np
import pandas as pd
import psutil
import pytest
import ray

import raysim
from raysim import Cost, register_algorithm
from raysim.algorithms.fedavg import FedAvg
from raysim.config import load_config
from raysim.errors import ConfigError
from raysim.results import reproducible
from raysim.system import SystemModel

from conftest import STRAGGLERS as CFG, object_store


def run(tmp_path, name, **overrides):
    result = raysim.run(CFG, out=tmp_path / name, **overrides)
    return result.rounds, result.clients


@pytest.mark.slow  # long; run with -m slow
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


@pytest.mark.parametrize("checkpoint", [{"every": 0, "replay_rounds": 3}, pytest.param({"every": 2}, marks=pytest.mark.slow),
                                        pytest.param({"every": 0}, marks=pytest.mark.slow)], ids=["snapshot", "disk", "replay"])
def test_a_killed_client_actor_is_restarted_and_the_run_is_unchanged(ray_cluster, tmp_path, checkpoint):
    """Actor 1 dies mid-round 5: it restarts from the checkpoint of round 4 on disk, or from the
    in-memory snapshot after round 3 and replays round 4, or (no checkpoint) replays from round 1."""
    cfg = {**STATEFUL, "checkpoint": checkpoint}
    clean = raysim.run(cfg, out=tmp_path / "clean")
    faulty = raysim.run({**cfg, "faults": [{"round": 5, "actor": 1}]}, out=tmp_path / "faulty")
    assert faulty.rounds["actor_restarts"].tolist() == [0, 0, 0, 0, 1, 1]
    pd.testing.assert_frame_equal(reproducible(clean.rounds), reproducible(faulty.rounds))
    pd.testing.assert_frame_equal(reproducible(clean.clients), reproducible(faulty.clients))


def _kill_and_await_restarts(both: bool):
    """kill -9 a client actor (or both, 50 ms apart) and wait until Ray has restarted them, empty."""
    from chaos import client_actors  # here: the algorithm that calls this travels by value to actors without tests/

    me = psutil.Process()
    victims = client_actors(me)[: 2 if both else 1]
    for i, actor in enumerate(victims):
        time.sleep(0.05 * i)
        actor.kill()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len({p.pid for p in client_actors(me)} - {v.pid for v in victims}) == 2:
            return
        time.sleep(0.05)
    raise AssertionError("the killed client actors were not restarted")


class KilledWhileAggregating(FedAvgStateful):
    """FedAvgStateful whose server, while it aggregates round `at` (no call to the client actors in flight), kills
    client actors and waits until Ray has restarted them: the server's next call (round `at` + 1's step, or the
    save of round `at`'s checkpoint) reaches a new process that never got its data."""

    at, both = 0, False

    def aggregate(self, state, replies, rng):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == self.at:
            _kill_and_await_restarts(self.both)
        return super().aggregate(state, replies, rng)


register_algorithm("killed_at_3")(type("KilledAt3", (KilledWhileAggregating,), {"at": 3}))
register_algorithm("killed_at_4_both")(type("KilledAt4Both", (KilledWhileAggregating,), {"at": 4, "both": True}))


@pytest.mark.parametrize("algorithm", [pytest.param("killed_at_3", marks=pytest.mark.slow),
                                       pytest.param("killed_at_4_both", marks=pytest.mark.slow)])
def test_a_client_actor_restarted_before_the_next_call_is_reloaded_and_replayed(ray_cluster, tmp_path, algorithm):
    """Client actors restarted, empty, before the server's next call reaches them (one before round 4's step;
    both, 50 ms apart, before round 4's checkpoint is saved): the call finds them without state (StateLost), the
    server reloads them, restores the last checkpoint, replays the rounds since and calls again; the run's
    tables are those of a run without the fault."""
    cfg = {**STATEFUL, "cluster": {"num_actors": 2, "driver_shard": False}}
    clean = raysim.run(cfg, out=tmp_path / "clean", backend="local")
    faulty = raysim.run(cfg, {"algorithm.name": algorithm}, out=tmp_path / "faulty")
    assert faulty.rounds["actor_restarts"].iloc[-1] == (2 if algorithm.endswith("both") else 1)
    pd.testing.assert_frame_equal(reproducible(clean.rounds), reproducible(faulty.rounds))
    pd.testing.assert_frame_equal(reproducible(clean.clients), reproducible(faulty.clients))


def test_faults_are_validated_up_front(ray_cluster, tmp_path):
    with pytest.raises(ValueError, match="faults.0.round: 9 is after the last round"):
        load_config({**STATEFUL, "faults": [{"round": 9, "actor": 0}]})
    with pytest.raises(ConfigError, match="faults: actor 5 does not exist"):
        raysim.run({**STATEFUL, "faults": [{"round": 1, "actor": 5}]}, out=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()  # a mistake in the input leaves no results directory


def test_the_server_in_the_driver_or_in_an_actor_gives_the_same_tables(ray_cluster, tmp_path):
    cfg = {**CFG, "system": {**CFG["system"], "stragglers": {"deadline": 8.0}}}
    runs = {where: raysim.run({**cfg, "cluster": {**cfg["cluster"], "server": where}}, out=tmp_path / where)
            for where in ("driver", "actor")}
    assert {w: r.info["server"] for w, r in runs.items()} == {"driver": "driver", "actor": "actor"}
    for table in ("rounds", "clients"):
        pd.testing.assert_frame_equal(reproducible(getattr(runs["driver"], table)), reproducible(getattr(runs["actor"], table)))
    assert runs["driver"].rounds["dropped"].sum() > 0  # the deadline drops stragglers in both


@pytest.mark.slow  # long; run with -m slow
def test_the_driver_hosts_shard_0_checkpoints_it_and_resumes_it_to_the_same_numbers(ray_cluster, tmp_path):
    """By default the driver trains shard 0 itself (one client actor for two shards); the tables equal those
    of two client actors, and a run stopped after round 3 (round 4 already sent to the actor) checkpoints round 3,
    the actor's client states brought back from round 2's checkpoint, and resumes from it to the same numbers."""
    cfg = {**STATEFUL, "system": {**STATEFUL["system"], "stragglers": {"deadline": 8.0}}}
    here = raysim.run(cfg, out=tmp_path / "here")
    remote = raysim.run(cfg, out=tmp_path / "remote", cluster__driver_shard=False)
    assert ({k: here.info[k] for k in ("driver_shard", "shards", "actors")}
            == {"driver_shard": True, "shards": 2, "actors": 1})
    assert ({k: remote.info[k] for k in ("driver_shard", "shards", "actors")}
            == {"driver_shard": False, "shards": 2, "actors": 2})
    part = raysim.run(cfg, out=tmp_path / "part", on_round=lambda row: row["round"] < 3)
    resumed = raysim.run(None, resume=tmp_path / "part")
    assert resumed.info["resumed_from"] == 3 and resumed.info["driver_shard"]
    assert here.rounds["dropped"].sum() > 0
    for other in (remote, resumed):
        for table in ("rounds", "clients"):
            pd.testing.assert_frame_equal(reproducible(getattr(here, table)), reproducible(getattr(other, table)))


LONG = {"name": "long", "seed": 0, "data": {"source": "digits", "num_clients": 4},
        "model": {"name": "mlp", "hidden": [1024]},  # a 300 KB broadcast: the object store holds it, not the caller
        "algorithm": {"name": "fedavg", "clients_per_round": 2, "lr": 0.05, "local_steps": 1, "batch_size": 8},
        "checkpoint": {"every": 0, "replay_rounds": 20}, "eval": {"every": 50}, "cluster": {"num_actors": 2}}


@pytest.mark.slow  # long; run with -m slow
@pytest.mark.parametrize("rounds", [300, 2000])
def test_many_rounds_hold_the_object_store_and_the_driver_flat(ray_cluster, tmp_path, rounds):
    """No checkpoint (the replay log's worst case): past warm-up the object store holds at most
    `replay_rounds` broadcasts and the driver does not grow (an unbounded log adds one per round).
    Ray frees objects asynchronously, so each end is the least seen over 20 rounds. The driver's memory is
    its own pages (USS): its PSS also moves when other processes mapping torch's libraries start or end."""
    early, late = {}, {}

    def sample(row):
        window = early if 41 <= row["round"] <= 60 else late if row["round"] > rounds - 20 else None
        if window is not None:
            window[row["round"]] = (*object_store(), psutil.Process(os.getpid()).memory_full_info().uss)

    raysim.run({**LONG, "algorithm": {**LONG["algorithm"], "rounds": rounds}}, out=tmp_path / "long", on_round=sample)
    (mib0, objects0, driver0), (mib1, objects1, driver1) = (np.min(list(w.values()), axis=0) for w in (early, late))
    span = rounds - 50  # an unbounded log: + span objects and + 0.3 MiB * span
    assert objects1 - objects0 < span / 2 and mib1 - mib0 < 0.15 * span, (early, late)
    assert driver1 - driver0 < 30e6, (early, late)


def test_the_next_round_is_sent_before_this_one_is_evaluated(ray_cluster, tmp_path):
    """Under the virtual clock the client actors get round t+1 once round t is aggregated, so they train while
    the server evaluates round t; nothing is sent past the last round, and the rounds are a plain run's."""
    from raysim.actors.server import RoundServer
    from raysim.data import build_federated
    from raysim.round.experiment import Experiment

    cfg = load_config(CFG, {"algorithm.rounds": 3})
    server = RoundServer(Experiment.of(cfg), build_federated(cfg.data, cfg.seed, tmp_path / "data").to_dict())
    evaluate, seen, rows = server.engine.rows, [], []

    def rows_spy(rp, out, *args):
        seen.append((rp.round, server.sent and server.sent.rp.round, bool(server.sent and server.sent.refs)))
        return evaluate(rp, out, *args)

    server.engine.rows = rows_spy
    server.start()
    calls = []
    try:
        for t in (1, 2, 3):
            t0 = time.perf_counter()
            rows.append(server.run_round(t)[0])
            calls.append(time.perf_counter() - t0)
    finally:
        server.close()
    assert seen == [(1, 2, True), (2, 3, True), (3, None, False)]
    # a round's wall time is its own call's, not also the last round's evaluation it overlapped
    assert all(row["round_wall_s"] <= call for row, call in zip(rows, calls))
    plain, _ = run(tmp_path, "plain", algorithm__rounds=3)
    ours, plain = reproducible(pd.DataFrame(rows)), reproducible(plain)
    same = [c for c in plain.columns if c in ours.columns and c != "checkpoint"]  # this server has no run directory
    pd.testing.assert_frame_equal(ours[same], plain[same], check_dtype=False)


@pytest.mark.parametrize("overrides, early", [
    pytest.param({}, [True, True, False], id="timing-free"),
    pytest.param({"system.availability.kind": "markov", "system.availability.mean_on": 30.0}, [False] * 3,
                 id="availability"),
])
def test_the_next_round_leaves_before_this_ones_timing_unless_its_plan_needs_it(ray_cluster, tmp_path, overrides, early):
    """Round t+1 goes to the client actors once round t's replies are in the server's state, before its timing is
    sampled and booked (they train meanwhile), unless the next plan reads the ledger's time (system.availability
    chooses who is online); the tables are the local backend's, which books each round before planning the next."""
    from raysim.actors.server import RoundServer
    from raysim.data import build_federated
    from raysim.round.experiment import Experiment

    cfg = load_config(CFG, {"algorithm.rounds": 3, **overrides})
    server = RoundServer(Experiment.of(cfg), build_federated(cfg.data, cfg.seed, tmp_path / "data").to_dict())
    settle, sent_first = server.engine.settle, []

    def settle_spy(updated):
        sent_first.append(server.sent is not None and server.sent.rp.round == updated.rp.round + 1)
        return settle(updated)

    server.engine.settle = settle_spy
    server.start()
    rows, clients = [], []
    try:
        for t in (1, 2, 3):
            row, client_rows, _ = server.run_round(t)
            rows.append(row)
            clients.append(pd.DataFrame(client_rows))
    finally:
        server.close()
    assert sent_first == early
    local = raysim.run(CFG, out=tmp_path / "local", backend="local", algorithm__rounds=3,
                       **{k.replace(".", "__"): v for k, v in overrides.items()})
    ours, plain = reproducible(pd.DataFrame(rows)), reproducible(local.rounds)
    same = [c for c in plain.columns if c in ours.columns and c != "checkpoint"]  # this server has no run directory
    pd.testing.assert_frame_equal(ours[same], plain[same], check_dtype=False)
    ours_clients, plain_clients = reproducible(pd.concat(clients, ignore_index=True)), reproducible(local.clients)
    pd.testing.assert_frame_equal(ours_clients, plain_clients[list(ours_clients.columns)], check_dtype=False)
