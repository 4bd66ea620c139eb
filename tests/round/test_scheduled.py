"""The buffered and async schedules against their closed forms: synchronous FedAvg when every client takes the
same time and C = K = clients a round, sequential local SGD for FedAsync with one client at a time, the arrival rate
and FedBuff's staleness under exponential compute times; bitwise the same on both backends, every packing and
after a resume."""
import numpy as np
import pytest

import raysim
from raysim.results import HOST_COLUMNS

BASE = {
    "name": "schedules", "seed": 3, "backend": "local",
    "data": {"source": "digits", "num_clients": 20, "partition": {"kind": "dirichlet", "alpha": 0.5}},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "fedavg", "rounds": 6, "clients_per_round": 5, "lr": 0.1, "local_steps": 4, "batch_size": 8},
    "system": {"compute": {"unit": "batch"}},
    "eval": {"every": 2},
}
MODEL = ["test_accuracy", "test_loss", "train_loss", "oracle_calls", "upload_bytes", "download_bytes"]
EQUAL_TIMES = {"compute": {"unit": "batch", "times": "fixed", "shift": 1.0, "rate": 2.0}, "comm": {"phi": 0.0}}
MARKOV = {"compute": {"unit": "batch"}, "availability": {"kind": "markov", "mean_on": 15.0, "mean_off": 10.0}}


def run(tmp_path, name, **over):
    return raysim.run({**BASE, **over}, out=tmp_path / name, progress=False)


def same(a, b, columns):
    differ = [c for c in columns if not a[c].reset_index(drop=True).equals(b[c].reset_index(drop=True))]
    assert not differ, f"{differ} differ"


def test_buffered_with_equal_times_and_c_k_the_round_size_is_synchronous_fedavg(tmp_path):
    sync = run(tmp_path, "sync", system=EQUAL_TIMES)
    buffered = run(tmp_path, "buffered", system=EQUAL_TIMES, schedule={"kind": "buffered", "concurrency": 5, "buffer": 5})
    same(sync.rounds, buffered.rounds, MODEL + ["clients"])
    # the closed form: every client computes 4 steps x (1 + 1/2), so an update every 6.0 and Γ = b_t = 4 a round
    np.testing.assert_array_equal(buffered.rounds["sim_time"], 6.0 * np.arange(1, 7))
    np.testing.assert_array_equal(buffered.rounds["gamma"], sync.rounds["gamma"])
    np.testing.assert_array_equal(buffered.rounds["staleness_max"], 0)
    s, b = (t.sort_values(["round", "client_id"]).reset_index(drop=True) for t in (sync.clients, buffered.clients))
    same(s, b, ["round", "client_id", "oracle_calls", "compute_time"])
    np.testing.assert_array_equal(b["version_sent"], b["round"] - 1)
    np.testing.assert_array_equal(b["finish_time"], 6.0 * b["round"])  # on one clock, not from each round's start


def test_fedasync_one_client_at_a_time_with_alpha_one_is_sequential_local_sgd(tmp_path):
    one = {"algorithm": {**BASE["algorithm"], "clients_per_round": 1, "rounds": 8}}
    sequential = run(tmp_path, "sgd", **one)  # FedAvg with one client a round: local SGD, one client after another
    fedasync = run(tmp_path, "async", **one, schedule={"kind": "async", "concurrency": 1, "alpha": 1.0})
    same(sequential.rounds, fedasync.rounds, MODEL)
    np.testing.assert_array_equal(fedasync.clients["client_id"], sequential.clients["client_id"])
    np.testing.assert_array_equal(fedasync.clients["staleness"], 0)
    assert (fedasync.clients["start_time"].to_numpy()[1:] == fedasync.clients["finish_time"].to_numpy()[:-1]).all()


def test_arrivals_come_at_mu_c_and_fedbuffs_staleness_is_c_minus_1_over_k(tmp_path):
    """Exp(mu) compute (one step, no shift) and instant uploads: C busy clients are C Poisson(mu) processes, so
    updates arrive at rate mu*C; a task's mean lifetime 1/mu sees (C-1) other arrivals, (C-1)/K updates. Monte Carlo
    over 3,000 arrivals, 4 standard errors: 7% on the rate; 10% on the staleness (correlated, batch means)."""
    mu, c, k, updates = 2.0, 12, 4, 750
    res = run(tmp_path, "mc", data={"source": "digits", "num_clients": 100}, model={"name": "logreg"},
              algorithm={**BASE["algorithm"], "rounds": updates, "local_steps": 1},
              system={"compute": {"unit": "batch", "shift": 0.0, "rate": mu}, "comm": {"phi": 0.0}},
              schedule={"kind": "buffered", "concurrency": c, "buffer": k}, eval={"every": updates})
    arrivals = res.rounds["arrivals"].sum()
    rate = arrivals / res.rounds["sim_time"].iloc[-1]
    assert abs(rate / (mu * c) - 1) < 4 / np.sqrt(arrivals)
    stale = res.clients["staleness"].to_numpy()[c:]  # past the first updates
    batches = stale[: stale.size // 30 * 30].reshape(30, -1).mean(1)
    assert abs(batches.mean() - (c - 1) / k) < 4 * batches.std(ddof=1) / np.sqrt(30)
    assert abs(batches.mean() / ((c - 1) / k) - 1) < 0.1


def test_semi_sync_with_a_period_longer_than_every_task_is_synchronous_fedavg(tmp_path):
    """Every client done within the period: nothing arrives late, so each round applies its own clients unweighted."""
    sync = run(tmp_path, "sync", system=EQUAL_TIMES)
    semi = run(tmp_path, "semi", system=EQUAL_TIMES, schedule={"kind": "semi_sync", "period": 10.0})
    same(sync.rounds, semi.rounds, MODEL + ["clients"])
    np.testing.assert_array_equal(semi.rounds["sim_time"], 10.0 * np.arange(1, 7))  # closed every period


def test_semi_sync_applies_late_updates_in_a_later_round_with_their_staleness(tmp_path):
    res = run(tmp_path, "late", schedule={"kind": "semi_sync", "period": 6.0}, algorithm={**BASE["algorithm"], "rounds": 10})
    c = res.clients
    late = c[c["staleness"] > 0]
    assert len(late) and (late["version_applied"] == late["version_sent"] + 1 + late["staleness"]).all()
    assert (c["finish_time"] <= 6.0 * c["round"]).all() and (c["finish_time"] > 6.0 * (c["round"] - 1)).all()
    assert (res.rounds["round_sim_time"] == 6.0).all()
    dropped = run(tmp_path, "drop", schedule={"kind": "semi_sync", "period": 6.0, "max_staleness": 0},
                  algorithm={**BASE["algorithm"], "rounds": 10})
    assert dropped.clients["dropped"].sum() == (dropped.clients["staleness"] > 0).sum() > 0


def test_a_stale_update_beyond_max_staleness_is_dropped_and_counted(tmp_path):
    res = run(tmp_path, "drop", schedule={"kind": "async", "concurrency": 8, "max_staleness": 2})
    dropped = res.clients[res.clients["dropped"]]
    assert len(dropped) and (dropped["staleness"] > 2).all() and (dropped["version_applied"] == -1).all()
    assert (res.clients.loc[~res.clients["dropped"], "staleness"] <= 2).all()
    assert res.rounds["dropped"].sum() == len(dropped)
    assert res.rounds["arrivals"].sum() == len(res.clients)


def test_a_buffered_run_resumes_mid_run_to_the_same_numbers(tmp_path):
    """Tasks in flight, trained and not, the carried queue and the Markov availability all come back."""
    over = {"schedule": {"kind": "buffered", "concurrency": 7, "buffer": 3}, "checkpoint": {"every": 2},
            "system": MARKOV}
    whole = run(tmp_path, "whole", **over)
    part = raysim.run({**BASE, **over}, out=tmp_path / "part", progress=False, on_round=lambda row: row["round"] < 3)
    assert part.info["status"] == "stopped"
    resumed = raysim.run(None, resume=tmp_path / "part", progress=False)
    for table in ("rounds", "clients"):
        x, y = getattr(whole, table), getattr(resumed, table)
        same(x, y, [c for c in x.columns if c not in HOST_COLUMNS])




def online_at_start(result, **system):
    """Whether each client row's client was online when it started, by the run's own availability model."""
    from raysim.system.availability import Availability
    from raysim.system.config import SystemConfig

    avail = Availability(SystemConfig(**system).availability, BASE["seed"], BASE["data"]["num_clients"])
    rows = result.clients.sort_values("start_time", kind="stable")
    return np.array([avail.available(t, 0)[c] for c, t in zip(rows["client_id"], rows["start_time"])])


def test_clients_start_only_online_and_one_that_leaves_never_delivers(tmp_path):
    res = run(tmp_path, "markov", system=MARKOV, schedule={"kind": "buffered", "concurrency": 6, "buffer": 3},
              algorithm={**BASE["algorithm"], "rounds": 12})
    assert online_at_start(res, **MARKOV).all()
    lost = res.clients[res.clients["offline"]]
    assert len(lost) and lost["dropped"].all() and (lost["version_applied"] == -1).all()
    assert res.rounds["offline"].sum() == len(lost) and res.rounds["clients"].eq(3).all()
    assert (res.rounds["available"] < BASE["data"]["num_clients"]).any()


def test_synchronous_rounds_select_online_clients_and_drop_those_that_leave(tmp_path):
    system = {"compute": {"unit": "batch"}, "availability": {"kind": "diurnal", "period": 40.0, "on_fraction": 0.5}}
    res = run(tmp_path, "diurnal", system=system)
    from raysim.system.availability import Availability
    from raysim.system.config import AvailabilityConfig

    avail = Availability(AvailabilityConfig(**system["availability"]), BASE["seed"], BASE["data"]["num_clients"])
    starts = np.r_[0.0, res.rounds["sim_time"].to_numpy()[:-1]]
    for r, t in enumerate(starts, start=1):
        chosen = res.clients.loc[res.clients["round"] == r, "client_id"].to_numpy()
        assert avail.available(t, r)[chosen].all()
        assert res.rounds.loc[r - 1, "available"] == avail.available(t, r).sum()
    gone = res.clients[res.clients["offline"]]
    assert len(gone) and gone["dropped"].all() and (gone["upload_bytes"] == 0).all()


def test_a_speed_trace_divides_each_clients_compute_time(tmp_path):
    trace = tmp_path / "speed.csv"
    trace.write_text("client_id,speed\n" + "".join(f"{c},{1 + c % 3}\n" for c in range(20)))
    fixed = {"unit": "batch", "times": "fixed", "shift": 1.0, "rate": 1.0}
    res = run(tmp_path, "traced", system={"compute": {**fixed, "speed": "trace", "speed_file": str(trace)}})
    c = res.clients
    np.testing.assert_allclose(c["compute_time"], c["oracle_batches"] * 2.0 / (1 + c["client_id"] % 3), rtol=1e-15)


@pytest.mark.parametrize("schedule, packings", [
    ({"kind": "buffered", "concurrency": 7, "buffer": 3}, (2, 3)),
    ({"kind": "sync"}, (2,)),
], ids=["buffered", "sync"])
def test_with_availability_the_tables_are_bitwise_the_same_on_ray_for_every_packing(ray_cluster, tmp_path, schedule,
                                                                                    packings):
    over = {"schedule": schedule, "eval": {"every": 2, "clients": "selected"}, "system": MARKOV}
    local = run(tmp_path, "local", **over)
    assert local.clients["offline"].any()
    for actors in packings:
        on_ray = raysim.run({**BASE, **over, "backend": "ray"}, out=tmp_path / f"ray{actors}", progress=False,
                            cluster__num_actors=actors)
        for table in ("rounds", "clients"):
            x, y = getattr(local, table), getattr(on_ray, table)
            same(x, y, [c for c in x.columns if c not in HOST_COLUMNS])
