"""benchmarks/kernel_figures.py: the sweeps of Figs 4-6 (converged models over the regression
generators, specs/kernel-fedavg-fedprox.md §5.2-5.5, §6.15-6.17) and the figure plots."""
import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from threadpoolctl import threadpool_limits

from raysim.plots.kernel import plot_gain, plot_inverse_mse, plot_series

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "kernel_figures.py"
spec = importlib.util.spec_from_file_location("kernel_figures", PATH)
kf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kf)


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


def test_fig6_inverse_mse_at_N200():
    with threadpool_limits(1):
        table = kf.fig6_table(per_client=[10], trials=100).set_index("algorithm")["mse"]
    assert 1 / table["FedAvg s=1"] == pytest.approx(71.3, rel=0.15)  # spec §5.5 (500 trials)
    assert table["FedProx"] == pytest.approx(table["FedAvg s=1"], rel=0.03)
    assert table["FedAvg s=10"] > table["FedAvg s=1"]


def test_figure_plots_write_pngs(tmp_path):
    gain = pd.DataFrame({"gamma": [0, 0, 1, 1], "algorithm": ["a"] * 4, "client": ["scarce", "rich"] * 2,
                         "fg": [100, 4, 10, 0.5]})
    mse = pd.DataFrame({"N": [20, 40], "algorithm": ["a", "a"], "mse": [0.15, 0.07]})
    rounds = pd.DataFrame({"round": [1, 2], "grad_norm_sec61_prev": [1.0, 0.1], "coef_error": [2.0, 0.5]})
    for path in (plot_gain(gain, "gamma", "Γ", tmp_path / "g.png", "g"),
                 plot_inverse_mse(mse, tmp_path / "m.png", "m"),
                 plot_series({"a": rounds}, kf.ROUND_METRICS, tmp_path / "r.png", "r")):
        assert path.exists() and path.stat().st_size > 1000


@pytest.mark.slow
def test_fig4_full_sweep():
    """§6.15: 20 trials: FG decreasing in Gamma, scarce >> rich (about 100 vs 3.7 at 0), algorithms within 5%,
    crossings of FG = 1 in [5, 16] (scarce) and [0.2, 0.5] (rich)."""
    with threadpool_limits(1):
        fg = mean_fg(kf.fig4_table(), "gamma")
    gammas = np.array(kf.GAMMAS)
    for client, band in (("scarce", (5, 16)), ("rich", (0.2, 0.5))):
        g = fg.loc[client].values
        assert (np.diff(g, axis=0) < 0).all()
        assert (np.abs(g / g[:, :1] - 1) < 0.05).all()
        first_below = gammas[np.argmax(g[:, 0] < 1)]
        assert band[0] <= first_below and gammas[np.argmax(g[:, 0] < 1) - 1] <= band[1]
    assert 80 < fg.loc[("scarce", 0.0)].iloc[0] < 130 and 3.0 < fg.loc[("rich", 0.0)].iloc[0] < 4.5


@pytest.mark.slow
def test_fig5_full_sweep():
    """§6.16: algorithms within 5%; about 1-7 for r <= 16, >= 60 by r = 23; scarce plateau 95-110 for r in
    [30, 100] away from r = 50; rich falls to 3.5-4 at r = 100."""
    with threadpool_limits(1):
        fg = mean_fg(kf.fig5_table(), "rank")
    assert (np.abs(fg.values / fg.values[:, :1] - 1) < 0.05).all()
    s1 = fg["FedAvg s=1"]
    assert all(s1[("scarce", r)] < 8 for r in (1, 5, 10, 14, 16)) and s1[("scarce", 23)] >= 60
    assert all(85 <= s1[("scarce", r)] <= 115 for r in (30, 40, 60, 70, 80, 90, 95, 100))
    assert 3.0 <= s1[("rich", 100)] <= 4.5 and s1[("rich", 40)] > 80


@pytest.mark.slow
def test_fig6_full_sweep():
    """§6.17: 1/MSE about linear in N with slope about 1/3; FedProx within 2% of s = 1; s = 10 worst."""
    with threadpool_limits(1):
        table = kf.fig6_table()
    inv = table.assign(inv=1 / table["mse"]).pivot(index="N", columns="algorithm", values="inv")
    slope = np.polyfit(inv.index, inv["FedAvg s=1"], 1)[0]
    assert slope == pytest.approx(1 / 3, rel=0.15)
    assert inv.loc[200, "FedAvg s=1"] == pytest.approx(70, rel=0.1)
    assert (np.abs(inv["FedProx"] / inv["FedAvg s=1"] - 1) < 0.02).all()
    assert (inv["FedAvg s=10"] <= inv[["FedAvg s=1", "FedAvg s=5", "FedProx"]].min(axis=1) * 1.001).all()
