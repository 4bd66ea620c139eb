import math

import numpy as np
import pytest

from raysim.contract import Cost
from raysim.core.rng import SERVER, stream
from raysim.system import (
    Ledger,
    SystemConfig,
    SystemModel,
    compute_time,
    explicit_completions,
    speed_factors,
)
from raysim.system.analytic import expected_compute_phase


def _model(seed: int = 0, num_clients: int = 50, **section) -> SystemModel:
    return SystemModel(SystemConfig.model_validate(section), seed, num_clients)


def test_gamma_fedavg_exact(run_round):
    T, m, b, phi = 7, 10, 5, 2.5
    model, ledger = _model(comm={"phi": phi}, num_clients=m), Ledger()
    for t in range(T):
        ledger.add(run_round(model, t, [Cost(oracle_calls=b, upload_vectors=1.0)] * m), [], Cost())
    assert ledger.gamma == T * (b + phi * m)


def _fedlrgd_rounds(m: int, s: int, r: int, big_s: int) -> list[tuple[list[Cost], Cost]]:
    """FedLRGD's epochs (B, A, C x (r-1), B) as (client costs, server cost) per round."""
    none: list[Cost] = []
    upload = [Cost(upload_vectors=1.0)] * m
    return (
        [(none, Cost(oracle_calls=r * r))]
        + [([Cost(oracle_calls=r * s, upload_vectors=1.0)] * m, Cost())]
        + [(upload, Cost())] * (r - 1)
        + [(none, Cost(oracle_calls=r * big_s))]
    )


@pytest.mark.parametrize("phi, gamma", [(100.0, 20_188), (0.0, 188)])
def test_gamma_fedlrgd_example(run_round, phi, gamma):
    # FedLRGD, algorithms/fedlrgd/README.md: Gamma = r^2 + rs + rS + phi*m*r; phi = 0 leaves the per-client call count.
    m, s, r, big_s = 50, 20, 4, 23
    model, ledger = _model(comm={"phi": phi}, num_clients=m), Ledger()
    for t, (costs, server) in enumerate(_fedlrgd_rounds(m, s, r, big_s)):
        ledger.add(run_round(model, t, costs, server), costs, server)
    assert ledger.gamma == gamma
    assert ledger.oracle_calls == r * r + m * r * s + r * big_s


def test_gamma_phi_zero_is_raw_calls_for_one_client(run_round):
    model, ledger = _model(comm={"phi": 0.0}, num_clients=1), Ledger()
    for t, calls in enumerate([3, 0, 11, 7]):
        costs, server = [Cost(oracle_calls=calls, upload_vectors=1.0)], Cost(oracle_calls=t)
        ledger.add(run_round(model, t, costs, server), costs, server)
    assert ledger.gamma == ledger.oracle_calls == 3 + 0 + 11 + 7 + (0 + 1 + 2 + 3)


def test_gamma_fractional_uploads_pro_rata(run_round):
    m, b, phi, sketch, d = 8, 4, 50.0, 10, 1000  # a sketch of 10 of 1000 numbers is 0.01 vectors
    timing = run_round(_model(comm={"phi": phi}, num_clients=m), 0, [Cost(oracle_calls=b, upload_vectors=sketch / d)] * m)
    assert timing.gamma == pytest.approx(b + phi * m * sketch / d, rel=1e-14)


def test_unit_batch_vs_sample(run_round):
    cost = Cost(oracle_calls=160, oracle_batches=5, upload_vectors=1.0)
    for unit, calls in [("sample", 160), ("batch", 5)]:
        model = _model(seed=3, comm={"phi": 0.0}, compute={"unit": unit}, num_clients=2)
        timing = run_round(model, 4, [cost, cost])
        assert timing.gamma == calls
        u = stream(3, 4, SERVER, "client_compute").random(2)[1]  # client 1's uniform of round 4
        assert timing.compute_time[1] == compute_time(calls, u, 1.0, 1.0)


def test_round_timing_structure(run_round):
    m = 12
    model = _model(seed=5, comm={"phi": 3.0}, stragglers={"deadline": 14.0}, num_clients=m)
    costs = [Cost(oracle_calls=6, upload_vectors=1.0, upload_bytes=100)] * (m - 2) + [Cost(oracle_calls=6)] * 2
    timing = run_round(model, 2, costs, Cost(oracle_calls=9))
    kept_up = ~timing.dropped & (np.array([c.upload_vectors for c in costs]) > 0)
    assert timing.dropped.any() and kept_up.any()
    assert timing.compute_phase == 14.0
    assert np.all(timing.upload_time[~kept_up] == 0) and np.all(timing.upload_time[kept_up] > 0)
    assert timing.comm_phase == timing.upload_time.max()
    assert np.array_equal(timing.finish_time[kept_up], timing.compute_phase + timing.upload_time[kept_up])
    assert np.array_equal(timing.finish_time[~kept_up], timing.compute_time[~kept_up])
    assert timing.server_phase == model.server_compute_time(2, Cost(oracle_calls=9))
    assert timing.round_time == timing.compute_phase + timing.comm_phase + timing.server_phase
    assert timing.gamma == 6 + 9 + 3.0 * kept_up.sum()


def test_gamma_leaves_out_the_clients_dropped_at_the_deadline(run_round):
    """A client with 40 calls (at least 40 time units) misses a deadline of 14: it delivers nothing, so b_t is the
    kept clients' 4 calls, not its 40."""
    model = _model(seed=2, comm={"phi": 0.0}, stragglers={"deadline": 14.0}, num_clients=3)
    timing = run_round(model, 1, [Cost(oracle_calls=4), Cost(oracle_calls=4), Cost(oracle_calls=40)], Cost())
    assert timing.dropped.tolist() == [False, False, True]
    assert timing.gamma == 4


def test_server_only_round(run_round):
    model = _model(seed=1)
    timing = run_round(model, 0, [], Cost(oracle_calls=25))
    assert timing.compute_phase == timing.comm_phase == 0.0
    assert timing.round_time == timing.server_phase == compute_time(25, stream(1, 0, SERVER, "compute"), 1.0, 1.0)
    assert timing.gamma == 25
    assert model.stragglers(np.array([], dtype=int), np.array([]), None)[1] == 0.0


def _times(model: SystemModel, round: int, clients, calls: int = 5) -> np.ndarray:
    return model.client_compute_times(round, clients, [Cost(oracle_calls=calls)] * len(clients))


def test_deadline_drops_exactly_the_late():
    model = _model(seed=2, stragglers={"deadline": 12.0}, num_clients=200)
    clients = np.arange(200)
    times = _times(model, 0, clients)
    dropped, end = model.stragglers(clients, times, None)
    assert np.array_equal(dropped, times > 12.0) and 0 < dropped.sum() < 200
    assert end == 12.0
    lenient = _model(seed=2, stragglers={"deadline": 1e9}, num_clients=200)
    dropped, end = lenient.stragglers(clients, times, None)
    assert not dropped.any() and end == times.max()


def test_over_selection_keeps_the_earliest():
    model = _model(seed=4, stragglers={"over_select": 5}, num_clients=30)
    clients = np.arange(30)
    times = _times(model, 1, clients)
    dropped, end = model.stragglers(clients, times, keep=10)
    assert np.array_equal(np.flatnonzero(~dropped), np.sort(np.argsort(times)[:10]))
    assert end == np.sort(times)[9]


def test_over_selection_ties_by_client_id():
    model = _model()
    clients = np.array([7, 3, 9, 1, 5])
    times = np.array([2.0, 1.0, 1.0, 3.0, 1.0])
    dropped, end = model.stragglers(clients, times, keep=2)
    assert clients[~dropped].tolist() == [3, 5] and end == 1.0


def test_deadline_then_over_selection():
    model = _model(stragglers={"deadline": 2.5, "over_select": 2})
    clients = np.arange(6)
    times = np.array([1.0, 3.0, 0.5, 2.0, 2.4, 9.0])
    dropped, end = model.stragglers(clients, times, keep=2)
    assert np.flatnonzero(~dropped).tolist() == [0, 2]
    assert end == 1.0  # the server had its 2 replies at 1.0 and stopped waiting: the late ones cost nothing
    exactly = np.array([1.0, 3.0, 0.5, 2.6, 2.7, 9.0])  # 2 by the deadline, the rest late
    assert model.stragglers(clients, exactly, keep=2)[1] == 1.0
    short = np.array([1.0, 3.0, 2.6, 2.7, 2.8, 9.0])  # only 1 of the 2 it wants by the deadline
    dropped, end = model.stragglers(clients, short, keep=2)
    assert np.flatnonzero(~dropped).tolist() == [0] and end == 2.5


def test_over_selection_round_is_charged_by_the_kept_clients(run_round):
    model = _model(seed=6, stragglers={"deadline": 11.0, "over_select": 6}, num_clients=16)
    costs = [Cost(oracle_calls=5, upload_vectors=1.0)] * 16
    timing = run_round(model, 3, costs, keep=10)
    late = timing.compute_time > 11.0
    assert late.any() and (~late).sum() >= 10  # someone missed the deadline, yet 10 made it
    assert timing.compute_phase == np.sort(timing.compute_time)[9] < 11.0
    assert timing.round_time == timing.compute_phase + timing.comm_phase + timing.server_phase


def test_draws_depend_only_on_seed_round_client(run_round):
    cfg = {"stragglers": {"deadline": 11.0}, "compute": {"speed": "lognormal"}}
    clients = np.arange(40)
    forward = _times(_model(seed=8, **cfg), 3, clients)
    backward = _times(_model(seed=8, **cfg), 3, clients[::-1])[::-1]
    evens, odds = _model(seed=8, **cfg), _model(seed=8, **cfg)  # two "actors"
    split = np.empty(40)
    split[1::2] = _times(odds, 3, clients[1::2])
    split[0::2] = _times(evens, 3, clients[0::2])
    assert np.array_equal(forward, backward) and np.array_equal(forward, split)
    model = _model(seed=8, **cfg)
    assert np.array_equal(model.stragglers(clients, forward, None)[0], model.stragglers(clients, split, None)[0])
    assert not np.array_equal(forward, _times(_model(seed=9, **cfg), 3, clients))


def test_burke_does_not_depend_on_nu(run_round):
    costs = [Cost(oracle_calls=3, upload_vectors=1.0)] * 20
    a = run_round(_model(seed=6, comm={"nu": 2.0}), 0, costs)
    b = run_round(_model(seed=6, comm={"nu": 7.0}), 0, costs)
    assert np.array_equal(a.upload_time, b.upload_time) and a.round_time == b.round_time


def test_explicit_mode_uses_the_queue(run_round):
    costs = [Cost(oracle_calls=3, upload_vectors=1.0)] * 20
    timing = run_round(_model(seed=6, comm={"mode": "explicit", "phi": 2.0, "nu": 1.5}), 5, costs)
    want = explicit_completions(np.ones(20), 2.0, 1.5, stream(6, 5, SERVER, "upload"))
    assert np.array_equal(timing.upload_time, want)


def test_speed_factor_divides_client_time():
    fast = _model(seed=3, compute={"speed": "lognormal", "speed_sigma": 0.8}, num_clients=10)
    plain = _model(seed=3, num_clients=10)
    factors = speed_factors(10, 0.8, seed=3)
    cost = Cost(oracle_calls=9)
    clients = np.arange(10)
    np.testing.assert_allclose(fast.client_compute_times(2, clients, [cost] * 10),
                               plain.client_compute_times(2, clients, [cost] * 10) / factors, rtol=1e-14)
    assert fast.server_compute_time(2, cost) == plain.server_compute_time(2, cost)


def test_mean_round_time(run_round):
    k, b, phi, rounds = 20, 5, 1.0, 1500
    model = _model(seed=10, comm={"phi": phi}, num_clients=k)
    costs = [Cost(oracle_calls=b, upload_vectors=1.0)] * k
    t = np.array([run_round(model, r, costs).round_time for r in range(rounds)])
    # 4 s.e. of the Monte Carlo mean of a Type A round: b + E max_k Erlang(b) + phi*k.
    assert abs(t.mean() - (expected_compute_phase(b, k) + phi * k)) < 4 * t.std(ddof=1) / math.sqrt(rounds)


def test_ids_past_the_prefix_draw_get_the_very_uniforms_of_the_prefix(monkeypatch):
    """Client ids beyond PREFIX_DRAWS take their uniform from a stream copy advanced to it: the same numbers as
    the one prefix draw, so a federation of 10^8 clients keeps every client's compute time."""
    import raysim.system.model as model

    clients = np.array([4, 0, 1999, 733, 734])
    costs = [Cost(oracle_calls=3 + i) for i in range(len(clients))]
    prefix = _model(seed=5, num_clients=2000).client_compute_times(7, clients, costs)
    monkeypatch.setattr(model, "PREFIX_DRAWS", 100)
    advanced = _model(seed=5, num_clients=2000).client_compute_times(7, clients, costs)
    assert np.array_equal(prefix, advanced)
