"""raysim.algorithms.kernel.figures: the minibatch runs of Figs 2-3 (Sec. 6.1), the sweeps of Figs 4-6
(converged models over the regression generators, the kernel FedAvg/FedProx paper, algorithms/kernel/README.md) and
the figure plots."""

import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

from raysim.algorithms.kernel.algorithm import (fedavg_theta, fedprox_theta, feature_stats, global_gradient, minibatch_theta,
                                      prox_factor)
from raysim.algorithms.kernel import figures as kf
from raysim.algorithms.kernel.plots import plot_gain, plot_inverse_mse, plot_panels, plot_series



def mean_fg(table, key):
    return table.groupby(["client", key, "algorithm"], sort=False)["fg"].mean().unstack()


def test_l2_gram_is_the_exact_integral():
    H = kf.l2_gram(5)
    x = np.linspace(-1, 1, 200001)
    e = np.array([0.3, -1.0, 2.0, 0.5, -0.7, 1.1])
    f = np.polynomial.polynomial.polyval(x, e)
    assert e @ H @ e == pytest.approx(np.trapezoid(f * f, x), rel=1e-8)


def test_fig4_sweep_shape_one_trial():
    with threadpool_limits(1):
        table = kf.fig4_table(gammas=[0.0, 0.3, 20.0], trials=1)
    fg = mean_fg(table, "gamma")
    assert (fg.loc["scarce"].values > fg.loc["rich"].values).all()
    assert (np.diff(fg.loc["scarce"].values, axis=0) < 0).all() and (np.diff(fg.loc["rich"].values, axis=0) < 0).all()
    assert (np.abs(fg.values / fg.values[:, :1] - 1) < 0.05).all()  # four algorithms within 5%
    assert 60 < fg.loc[("scarce", 0.0)].iloc[0] < 160 and 2.5 < fg.loc[("rich", 0.0)].iloc[0] < 5.5


def test_fig4_scarce_gain_follows_closed_form():
    """Issue 19: the data-scarce client's FG in the Fig. 4 sweep against its closed form (README, `gain_gaussian`
    of the drawn truths) over 4 trials: per-trial relative s.d. about 0.1 (s.e. 5%), tolerance 15%."""
    with threadpool_limits(1):
        table = kf.fig4_table(gammas=[0.0, 1.0, 15.0], trials=4)
    mean = kf.fig4_means(table).loc["scarce"]
    assert np.allclose(mean.drop(columns="closed form").to_numpy(), mean[["closed form"]].to_numpy(), rtol=0.15)
    assert 95 < mean.loc[0.0, "closed form"] < 115  # 104 at ||theta*||^2 = d


def test_fig6_inverse_mse_at_N200():
    with threadpool_limits(1):
        table = kf.fig6_table(per_client=[10], trials=100).set_index("algorithm")["mse"]
    assert 1 / table["FedAvg s=1"] == pytest.approx(71.3, rel=0.15)  # Fig. 6 at N = 200 (500 trials)
    assert table["FedProx"] == pytest.approx(table["FedAvg s=1"], rel=0.03)
    assert table["FedAvg s=10"] > table["FedAvg s=1"]


def test_figure_plots_write_pngs(tmp_path):
    gain = pd.DataFrame({"gamma": [0, 0, 1, 1], "algorithm": ["a"] * 4, "client": ["scarce", "rich"] * 2,
                         "fg": [100, 4, 10, 0.5], "closed_form": [104, 3.7, 11, 0.45]})
    mse = pd.DataFrame({"N": [20, 40], "algorithm": ["a", "a"], "mse": [0.15, 0.07]})
    rounds = pd.DataFrame({"round": [1, 2], "grad_norm_sec61_prev": [1.0, 0.1], "coef_error": [2.0, 0.5]})
    for path in (plot_gain(gain, "gamma", "Γ", tmp_path / "g.png", "g"),
                 plot_inverse_mse(mse, tmp_path / "m.png", "m"),
                 plot_series({"a": rounds}, kf.ROUND_METRICS, tmp_path / "r.png", "r"),
                 plot_panels({"full": {"a": rounds}, "B = 20": {"a": rounds}}, kf.ROUND_METRICS[0],
                             tmp_path / "p.png", "p")):
        assert path.exists() and path.stat().st_size > 1000


def test_round_plots_skip_unevaluated_rounds(monkeypatch, tmp_path):
    """Metrics evaluated every k rounds are NaN in between: each curve must join the evaluated rounds (NaN
    neighbours would leave isolated points and no visible line), `_prev` columns shifted to round t - 1."""
    import raysim.algorithms.kernel.plots as kp
    figures = []
    monkeypatch.setattr(kp, "save_figure", lambda fig, path, dpi: figures.append(fig))
    rounds = pd.DataFrame({"round": [1, 2, 3, 4, 5, 6], "coef_error": [np.nan, 2.0, np.nan, 1.0, np.nan, 0.5],
                           "grad_norm_sec61_prev": [np.nan, 0.3, np.nan, 0.2, np.nan, 0.1]})
    kp.plot_series({"a": rounds}, kf.ROUND_METRICS, tmp_path / "r.png", "r")
    kp.plot_panels({"full": {"a": rounds}}, kf.ROUND_METRICS[0], tmp_path / "p.png", "p")
    (grad, coef), (panel,) = ([ax.lines[0] for ax in fig.axes] for fig in figures)
    kp.plt.close("all")
    assert coef.get_xdata().tolist() == [2, 4, 6] and coef.get_ydata().tolist() == [2.0, 1.0, 0.5]
    for line in (grad, panel):
        assert line.get_xdata().tolist() == [1, 3, 5] and line.get_ydata().tolist() == [0.3, 0.2, 0.1]


def test_fg_crossing_interpolates_linearly_between_grid_points():
    x = np.array([0.0, 10.0, 20.0])
    assert kf.fg_crossing(x, np.array([3.0, 1.5, 0.5])) == pytest.approx(15.0)
    assert kf.fg_crossing(x, np.array([3.0, 1.0, 0.5])) == 10.0
    assert np.isnan(kf.fg_crossing(x, np.array([3.0, 2.0, 1.0])))


@pytest.fixture(scope="module")
def sec61_runs(sec51_problem) -> dict:
    """Sec. 6.1's set-up at seed 0 (theta_0 = 0) iterated with the family's local updates for 150 rounds:
    {(B, series): (||grad l(theta_t)|| in the Sec. 6.1 convention, ||theta_t - theta*||) for t = 1..rounds},
    B = None for full batch."""
    theta_star, X, ys, eta = sec51_problem
    M, d = len(X), X[0].shape[1]
    S, b = zip(*[feature_stats(x, y) for x, y in zip(X, ys)])
    chols = [prox_factor(Si, eta) for Si in S]
    w = np.full(M, 1 / M)
    runs = {}
    with threadpool_limits(1):
        for B in kf.BATCH_SIZES:
            for label, (method, s) in kf.ALGORITHMS.items():
                theta, grad, err = np.zeros(d), [], []
                for _ in range(150):
                    if B is not None:
                        new = [minibatch_theta(theta, x, y, eta, method, s, B) for x, y in zip(X, ys)]
                    elif method == "fedprox":
                        new = [fedprox_theta(theta, c, bi, eta) for c, bi in zip(chols, b)]
                    else:
                        new = [fedavg_theta(theta, Si, bi, eta, s) for Si, bi in zip(S, b)]
                    theta = sum(wi * t for wi, t in zip(w, new))
                    grad.append(2 * np.linalg.norm(global_gradient(theta, S, b, w)))
                    err.append(np.linalg.norm(theta - theta_star))
                runs[(B, label)] = (np.array(grad), np.array(err))
    return runs


def rounds_to_5pct(err: np.ndarray) -> int:
    return int(np.argmax(np.abs(err - err[-1]) <= 0.05 * err[-1])) + 1


@pytest.mark.slow
def test_fig2_minibatch_gradient_plateaus(sec61_runs):
    """Fig. 2 (seed 0, 150 rounds): s = 5, 10 plateaus change < 30% against full batch;
    the s = 1 minibatch plateau is about 4e-3 (no longer 0); FedProx within 10% of FedAvg s = 1; each plateau
    within 15% of an independent implementation's seed-0 value (Fig. 1's tolerance)."""
    runs = sec61_runs
    spec = {20: (4.17e-3, 1.02e-2, 1.72e-2, 4.13e-3), 50: (4.13e-3, 1.02e-2, 1.72e-2, 4.24e-3),
            100: (4.09e-3, 1.01e-2, 1.72e-2, 4.21e-3)}  # s = 1 / 5 / 10 / FedProx
    plateau = {key: g[-1] for key, (g, _) in runs.items()}
    assert plateau[(None, "FedAvg s=1")] < 1e-4  # full batch: s = 1 heads to a stationary point
    for B, want in spec.items():
        for label, v in zip(kf.ALGORITHMS, want):
            assert plateau[(B, label)] == pytest.approx(v, rel=0.15), (B, label, plateau[(B, label)])
        for label in ("FedAvg s=5", "FedAvg s=10"):
            assert abs(plateau[(B, label)] / plateau[(None, label)] - 1) < 0.3, (B, label)
        assert plateau[(B, "FedAvg s=1")] == pytest.approx(4e-3, rel=0.15)
        assert plateau[(B, "FedProx")] == pytest.approx(plateau[(B, "FedAvg s=1")], rel=0.1)


@pytest.mark.slow
def test_fig3_minibatch_estimation_errors(sec61_runs):
    """Fig. 3 (seed 0, 150 rounds): final errors within 3% of full batch and in
    0.0466-0.0476; rounds to within 5% of the final error about 60 / 13 / 7 / 61 (s = 1 / 5 / 10 / FedProx;
    full batch 57 / 12 / 7 / 64): minibatches slow s = 1 down only a bit."""
    runs = sec61_runs
    spec_rounds = {"FedAvg s=1": 60, "FedAvg s=5": 13, "FedAvg s=10": 7, "FedProx": 61}
    for B in kf.BATCH_SIZES[1:]:
        for label, want in spec_rounds.items():
            err, full = runs[(B, label)][1], runs[(None, label)][1]
            assert abs(err[-1] / full[-1] - 1) < 0.03 and 0.0466 * 0.99 <= err[-1] <= 0.0476 * 1.01, (B, label)
            assert abs(rounds_to_5pct(err) - want) <= max(2, 0.1 * want), (B, label, rounds_to_5pct(err))
        assert rounds_to_5pct(runs[(B, "FedAvg s=1")][1]) <= 1.1 * rounds_to_5pct(runs[(None, "FedAvg s=1")][1])


@pytest.mark.slow
def test_fig4_full_sweep():
    """Fig. 4, 20 trials: FG decreasing in Gamma, scarce >> rich (about 100 vs 3.7 at 0), algorithms within 5%,
    crossings of FG = 1 in [5, 16] (scarce) and [0.2, 0.5] (rich); each client's mean FG within 7% of the mean
    closed form at every Gamma (per-trial relative s.d. about 0.1: s.e. 2.2%)."""
    with threadpool_limits(1):
        table = kf.fig4_table()
    fg = mean_fg(table, "gamma")
    closed = kf.fig4_means(table)["closed form"]
    for client in ("scarce", "rich"):
        g = fg.loc[client].values
        assert (np.diff(g, axis=0) < 0).all()
        assert (np.abs(g / g[:, :1] - 1) < 0.05).all()
        assert (np.abs(g / closed.loc[client].to_numpy()[:, None] - 1) < 0.07).all()
    crossings = kf.fig4_crossings(table)
    assert crossings.loc["scarce"].between(5, 16).all() and crossings.loc["rich"].between(0.2, 0.5).all()
    assert 80 < fg.loc[("scarce", 0.0)].iloc[0] < 130 and 3.0 < fg.loc[("rich", 0.0)].iloc[0] < 4.5


TRANSITION = (16, 23, 30)  # the coupon-collecting jump of Fig. 5 (Sec. 6.3)


@pytest.mark.slow
def test_fig5_full_sweep():
    """Fig. 5, converged models: algorithms within 5% at every r; about 1-7 for r <= 14; scarce plateau 95-110
    for r in [40, 100] away from the r = 50 spike; rich about 45 / 33 / 3.5-4 at r = 90 / 95 / 100 (20 trials,
    the paper's count). In the transition r = 16-30 one trial's FG is bimodal (about 90-100 when the 20 clients'
    r-subsets cover all 100 coordinates, 10-20 when one is missed: P(missed) = 0.96 / 0.42 / 0.08), so a 20-trial
    mean has a standard error of 4-9 there: the transition uses 100 trials (SE 1.7-4.1) and is compared with an
    independent implementation's 20-trial means (6.5 / 78 / 100) within 3 standard errors of the difference."""
    with threadpool_limits(1):
        table = pd.concat([kf.fig5_table(ranks=[r for r in kf.RANKS if r not in TRANSITION]),
                           kf.fig5_table(ranks=TRANSITION, trials=100)], ignore_index=True)
    fg = mean_fg(table, "rank")
    assert (np.abs(fg.values / fg.values[:, :1] - 1) < 0.05).all()
    s1 = fg["FedAvg s=1"]
    assert all(s1[("scarce", r)] < 8 for r in (1, 5, 10, 14))
    assert all(95 <= s1[("scarce", r)] <= 110 for r in (40, 60, 70, 80, 90, 95, 100))
    assert all(abs(s1[("rich", r)] / s1[("scarce", r)] - 1) < 0.05 for r in kf.RANKS if r <= 40)
    assert s1[("rich", 40)] == pytest.approx(100, rel=0.1) and 3.5 <= s1[("rich", 100)] <= 4.0
    assert s1[("rich", 90)] == pytest.approx(45, rel=0.15) and s1[("rich", 95)] == pytest.approx(33, rel=0.15)
    one = table[(table["algorithm"] == "FedAvg s=1") & (table["client"] == "scarce")].groupby("rank")["fg"]
    for r, spec in zip(TRANSITION, (6.5, 78, 100)):
        sd = one.std()[r]
        assert abs(one.mean()[r] - spec) <= 3 * sd * np.sqrt(1 / one.count()[r] + 1 / 20), (r, one.mean()[r], sd)


@pytest.mark.slow
def test_fig6_full_sweep():
    """Fig. 6: 1/MSE about linear in N with slope about 1/3; FedProx within 2% of s = 1; s = 10 worst."""
    with threadpool_limits(1):
        table = kf.fig6_table()
    inv = table.assign(inv=1 / table["mse"]).pivot(index="N", columns="algorithm", values="inv")
    slope = np.polyfit(inv.index, inv["FedAvg s=1"], 1)[0]
    assert slope == pytest.approx(1 / 3, rel=0.15)
    assert inv.loc[200, "FedAvg s=1"] == pytest.approx(70, rel=0.1)
    assert (np.abs(inv["FedProx"] / inv["FedAvg s=1"] - 1) < 0.02).all()
    assert (inv["FedAvg s=10"] <= inv[["FedAvg s=1", "FedAvg s=5", "FedProx"]].min(axis=1) * 1.001).all()
