"""ZO-SCAFFOLD's control variates and corrections against eqs. (91) (Type I) and (93) (Type II) of
FZooS, algorithms/fzoos/README.md, with every FD estimate recomputed in the test by eq. (3) from the points the
clients queried: Delta(x) = (1/Q) sum_q (y(x + lambda u_q) - y(x)) / lambda u_q (Gaussian u_q)."""
from collections import defaultdict

import pytest
import torch

from raysim.algorithms.fzoos.fedzo import ZOScaffold1, ZOScaffold2

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N, D, T, Q, LAM, LR = 3, 5, 3, 4, 0.01, 1e-3
PARAMS = {"objective": {"dim": D}, "local_steps": T, "directions": Q, "smoothing": LAM, "optimizer": "sgd",
          "lr": LR, "clip_iterates": False, "fd_directions": "gaussian"}


def spy_on_queries(algo):
    """Record every batch a client queries: calls[client] = [(points (k, d), values (k,)), ...]."""
    calls, query = defaultdict(list), algo.query

    def recorded(client, U, rng):
        y = query(client, U, rng)
        calls[client].append((U.clone(), y.clone()))
        return y

    algo.query = recorded
    return calls


def eq3(x, fx, batch):
    """Eq. (3) at x from its value fx and the Q queried points x + lambda u_q with their values."""
    P, yP = batch
    U = (P - x) / LAM
    return ((yP - fx) / LAM) @ U / len(P)


def local_round(calls):
    """One client's local round from its queries [x_0], then T times [FD batch at x_{t-1}], [x_t]:
    the iterates x_0..x_T and the FD estimates Delta(x_0)..Delta(x_{T-1})."""
    (x, fx), steps = calls[0], calls[1:]
    xs, fxs, deltas = [x[0]], [fx[0]], []
    for batch, (xn, fxn) in zip(steps[::2], steps[1::2]):
        deltas.append(eq3(xs[-1], fxs[-1], batch))
        xs.append(xn[0])
        fxs.append(fxn[0])
    assert len(deltas) == T and all(len(b[0]) == Q for b in steps[::2])
    return xs, deltas


def corrections(xs, deltas):
    """The correction each SGD step added to the FD estimate: (x_{t-1} - x_t) / lr - Delta(x_{t-1})."""
    return [(a - b) / LR - g for a, b, g in zip(xs, xs[1:], deltas)]


def test_scaffold2_controls_are_mean_raw_fd_estimates_and_correct_with_c_minus_ci(driver, one_round):
    """Eq. (93): c_i = (1/T) sum_t Delta_i(x_{r-1,t-1}^(i)) (the uncorrected estimates), c = (1/N) sum_i c_i;
    round 1 has no correction, round 2 steps with Delta_i(x) + c - c_i at every local step."""
    algo = driver[0](ZOScaffold2, num_clients=N, **PARAMS)
    calls = spy_on_queries(algo)
    state, cstates = algo.init(), {c: algo.client_init(c) for c in range(N)}
    x0 = state.x.clone()
    state, *_ = one_round(algo, state, cstates, 1)
    rounds1 = {c: local_round(calls[c]) for c in range(N)}
    for xs, deltas in rounds1.values():
        assert torch.equal(xs[0], x0)
        assert all(torch.allclose(v, torch.zeros(D, dtype=torch.float64), atol=1e-9) for v in corrections(xs, deltas))
    c_i = {c: torch.stack(deltas).mean(0) for c, (_, deltas) in rounds1.items()}
    c = torch.stack(list(c_i.values())).mean(0)
    assert torch.allclose(state.x, torch.stack([xs[-1] for xs, _ in rounds1.values()]).mean(0), atol=1e-14)
    for k in range(N):
        assert torch.allclose(cstates[k].control, c_i[k], rtol=1e-9, atol=1e-9)
    assert torch.allclose(state.shared, c, rtol=1e-9, atol=1e-9)

    calls.clear()
    state, *_ = one_round(algo, state, cstates, 2)
    for k in range(N):
        xs, deltas = local_round(calls[k])
        for v in corrections(xs, deltas):
            assert torch.allclose(v, c - c_i[k], rtol=1e-6, atol=1e-8)
        assert torch.allclose(cstates[k].control, torch.stack(deltas).mean(0), rtol=1e-9, atol=1e-9)


def test_scaffold1_controls_are_fd_estimates_at_the_new_global_point(driver, one_round):
    """Eq. (91): after the local phase every client estimates c_i = Delta_i(x_r) at the new global point
    x_r = (1/N) sum_i x_{r,T}^(i) (Q + 1 queries); c = (1/N) sum_i c_i; round 2 steps with Delta_i(x) + c - c_i."""
    algo = driver[0](ZOScaffold1, num_clients=N, **PARAMS)
    calls = spy_on_queries(algo)
    state, cstates = algo.init(), {c: algo.client_init(c) for c in range(N)}
    state, *_ = one_round(algo, state, cstates, 1)
    x1 = torch.stack([local_round(calls[c])[0][-1] for c in range(N)]).mean(0)
    assert torch.allclose(state.x, x1, atol=1e-14)
    calls.clear()
    state, *_ = one_round(algo, state, cstates, 2)
    c_i = {}
    for k in range(N):
        (x, fx), batch = calls[k]
        assert torch.equal(x[0], state.x) and len(batch[0]) == Q
        c_i[k] = eq3(x[0], fx[0], batch)
        assert torch.allclose(cstates[k].control, c_i[k], rtol=1e-9, atol=1e-9)
    c = torch.stack(list(c_i.values())).mean(0)
    assert torch.allclose(state.shared, c, rtol=1e-9, atol=1e-9)

    calls.clear()
    state, *_ = one_round(algo, state, cstates, 3)
    for k in range(N):
        xs, deltas = local_round(calls[k])
        assert torch.equal(xs[0], x1)
        for v in corrections(xs, deltas):
            assert torch.allclose(v, c - c_i[k], rtol=1e-6, atol=1e-8)
