"""Figures 1-6 of Su, Xu & Yang, "A non-parametric view of FedAvg and FedProx" (the kernel FedAvg/FedProx paper).

Run: python -m raysim.algorithms.kernel.figures FIGURE [--out DIR] [--trials T]
(FIGURE: fig1 fig2 fig3 fig4 fig5 fig6 general)

* fig1, fig2, fig3, general (README, Sobolev kernel): real runs through `raysim.run` of
  configs/kernel/kernel_fig1.yaml, kernel_fig2.yaml (full batch and B = 20/50/100; Fig. 2 plots the
  gradient norm of these runs, Fig. 3 the estimation error), kernel_general.yaml, one run per
  algorithm (FedAvg s = 1, 5, 10 and FedProx); figures of gradient norm and errors vs round.
* fig4, fig5, fig6: sweeps with converged models (the closed-form fixed point, README: finite
  horizons break the paper's "identical across algorithms"), over data drawn by the generators of
  algorithms/kernel/sources.py with the parameters of configs/kernel/kernel_fig4/5/6.yaml, fresh per
  trial; Fig. 4 also draws the closed-form FG of the README.
Each writes its table (Parquet) and PNG(s) under DIR (default runs/kernel_figures/FIGURE).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from raysim.algorithms.kernel.algorithm import (KernelFedAvgParams, expected_prediction_error, feature_stats,
                                      fixed_point_solver, truth_coefficients)
from raysim.config import ExperimentConfig, load_config
from raysim.storage.atomic import write_frame
from raysim.algorithms.kernel.sources import (RegressionOptions, client_sizes, linear_model, polynomial_grid,
                                    polynomial_model, sobolev_model, subspace_model)
from raysim.algorithms.kernel.federation_gain import empirical_gain, gain_gaussian, local_estimator
from raysim.algorithms.kernel.kernels import Monomial, Sobolev1
from raysim.algorithms.kernel.plots import ROUND_METRICS, plot_gain, plot_inverse_mse, plot_panels, plot_series
from raysim.core.rng import SERVER, SETUP, stream

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "kernel"
ALGORITHMS: dict[str, tuple[Literal["fedavg", "fedprox"], int]] = {"FedAvg s=1": ("fedavg", 1), "FedAvg s=5": ("fedavg", 5), "FedAvg s=10": ("fedavg", 10),
              "FedProx": ("fedprox", 1)}
GAMMAS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 1.0, 2.0, 5.0, 7.5, 10.0, 15.0, 20.0]
RANKS = [1, 5, 10, 14, 16, 18, 20, 23, 27, 30, 40, 50, 60, 70, 80, 90, 95, 100]


# ----------------------------------------------------------------------------- runs through the runtime

@contextmanager
def ray_session(config: Path):
    """One local Ray for several runs of `config` (each run would otherwise start and stop its own)."""
    import ray

    from raysim.runner import ensure_ray

    started = ensure_ray(load_config(config), None)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


def run_series(config: Path, out: Path, overrides: dict | None = None, algorithms=ALGORITHMS) -> dict[str, pd.DataFrame]:
    """One real run of `config` per algorithm; {label: rounds table}."""
    import raysim

    tables = {}
    with ray_session(config):
        for label, (method, s) in algorithms.items():
            over = {**(overrides or {}), "algorithm.name": f"kernel_{method}", "algorithm.local_steps": s}
            slug = label.replace(" ", "_").replace("=", "")
            tables[label] = raysim.run(config, over, out=out / slug).rounds
    return tables


def pooled_ols_error(run_dir: Path) -> float:
    """||theta_OLS - theta*|| of a linear-regression run: pooled least squares on its training file,
    theta* from the noise-free truth of its test file."""
    from raysim.algorithms.kernel.algorithm import split_targets
    from raysim.data import read_table_arrays

    x, y = read_table_arrays(run_dir / "data" / "train.parquet")
    tx, ty = read_table_arrays(run_dir / "data" / "test.parquet")
    truth = split_targets(ty)[1]
    assert truth is not None, "a regression source's test file holds the noise-free truth"
    star = truth_coefficients(tx, truth)
    return float(np.linalg.norm(np.linalg.lstsq(x, split_targets(y)[0], rcond=None)[0] - star))


def summarise_rounds(tables: dict[str, pd.DataFrame], ols: float | None = None) -> pd.DataFrame:
    """Per series: the last gradient norm (plateau), final errors, rounds to within 5% of the final error."""
    rows = []
    for label, r in tables.items():
        row: dict[str, str | float] = {"series": label}
        if "grad_norm_sec61_prev" in r:
            row["grad_plateau"] = float(r["grad_norm_sec61_prev"].iloc[-1])
        for col in ("coef_error", "pred_error_prev", "test_error"):
            if col in r:
                row[f"final_{col}"] = float(r[col].iloc[-1])
        if "coef_error" in r:
            final = r["coef_error"].iloc[-1]
            row["rounds_to_5pct"] = int(r["round"][(r["coef_error"] - final).abs() <= 0.05 * final].iloc[0])
            if ols is not None:
                row["error_over_ols"] = float(final / ols)
        rows.append(row)
    return pd.DataFrame(rows)


def fig1(out: Path, **_) -> list[Path]:
    tables = run_series(CONFIGS / "kernel_fig1.yaml", out)
    summary = summarise_rounds(tables, pooled_ols_error(out / "FedAvg_s1"))
    write_frame(summary, out / "fig1.parquet")
    print(summary.to_string(index=False))
    return [plot_series(tables, ROUND_METRICS[:2], out / "kernel_fig1.png", "Fig. 1: full batch")]


BATCH_SIZES = (None, 20, 50, 100)  # Figs 2-3 panels (a)-(d): full batch (redraws Fig. 1), then B = 20, 50, 100


def batch_panel(B: int | None) -> str:
    return "full batch" if B is None else f"B = {B}"


def minibatch_series(out: Path) -> dict[str, dict[str, pd.DataFrame]]:
    """Figs 2-3: the Fig. 1 runs with full local batches and with B = 20, 50, 100 (Sec. 6.1);
    {panel: {algorithm: rounds table}}."""
    config = CONFIGS / "kernel_fig2.yaml"
    with ray_session(config):
        return {batch_panel(B): run_series(config, out / ("full" if B is None else f"B{B}"),
                                           {"algorithm.batch_size": B})
                for B in BATCH_SIZES}


def summarise_minibatch(panels: dict[str, dict[str, pd.DataFrame]]) -> pd.DataFrame:
    """summarise_rounds per panel, with each minibatch plateau and final error relative to full batch (Figs 2-3)."""
    summary = pd.concat([summarise_rounds(tables).assign(panel=panel) for panel, tables in panels.items()],
                        ignore_index=True)
    full = summary[summary["panel"] == batch_panel(None)].set_index("series")
    for col in ("grad_plateau", "final_coef_error"):
        summary[f"{col}_over_full"] = summary[col] / summary["series"].map(full[col])
    return summary


def minibatch_figure(out: Path, figure: str, metric: tuple[str, str]) -> list[Path]:
    """The runs of Figs 2-3, their summary table, and one panel per batch size of `metric`."""
    panels = minibatch_series(out)
    summary = summarise_minibatch(panels)
    write_frame(summary, out / f"{figure}.parquet")
    print(summary.to_string(index=False))
    title = f"Fig. {figure[-1]}: {metric[1]}, full batch and minibatches"
    return [plot_panels(panels, metric, out / f"kernel_{figure}.png", title)]


def fig2(out: Path, **_) -> list[Path]:
    """Fig. 2 (a)-(d): ||grad l|| vs round, full batch and B = 20, 50, 100."""
    return minibatch_figure(out, "fig2", ROUND_METRICS[0])


def fig3(out: Path, **_) -> list[Path]:
    """Fig. 3 (a)-(d): ||theta_t - theta*|| vs round, full batch and B = 20, 50, 100 (the runs of Fig. 2)."""
    return minibatch_figure(out, "fig3", ROUND_METRICS[1])


def general(out: Path, **_) -> list[Path]:
    """The README's general kernel: Sobolev kernel, representer form; real runs, with the exact expected error curve."""
    config = CONFIGS / "kernel_general.yaml"
    algorithms = {k: v for k, v in ALGORITHMS.items() if k != "FedAvg s=10"}
    tables = run_series(config, out, algorithms=algorithms)
    cfg, p, params = _setup(config)
    sizes = client_sizes(p.sizes, cfg.data.num_clients)
    data = sobolev_model(sizes, p.noise, stream(cfg.seed, SETUP, SERVER, "figure:general"))
    X, truth = np.concatenate(data.x), np.concatenate(data.truth)
    G = Sobolev1().gram(X, X)
    ts = np.unique(np.geomspace(1, cfg.algorithm.rounds, 40).astype(int))
    for label, (method, s) in algorithms.items():
        expected = expected_prediction_error(G, sizes, truth, p.noise, params.eta, method, s, ts)
        tables[f"{label}: exact E (other draw)"] = pd.DataFrame({"round": ts + 1, "pred_error_prev": expected})
    write_frame(summarise_rounds(tables), out / "general.parquet")
    return [plot_series(tables, ROUND_METRICS[2:3], out / "kernel_general.png", "General kernel: Sobolev, 1/t and early stopping")]


# ----------------------------------------------------------------------------- closed-form sweeps

def _setup(config: Path) -> tuple[ExperimentConfig, RegressionOptions, KernelFedAvgParams]:
    """A kernel figure's config, its source's options and its algorithm's hyperparameters."""
    cfg = load_config(config)
    options, params = cfg.data.source_options(), cfg.algorithm_params()
    assert isinstance(options, RegressionOptions) and isinstance(params, KernelFedAvgParams)  # the kernel configs'
    return cfg, options, params


def _scarce_rich(sizes: np.ndarray, d: int, rng: np.random.Generator) -> tuple[int, int]:
    """One random data-scarce (n_j < d) and one random data-rich (n_j >= d) client."""
    return int(rng.choice(np.flatnonzero(sizes < d))), int(rng.choice(np.flatnonzero(sizes >= d)))


def solvers(data, sizes, eta: float) -> dict:
    """Each algorithm's map responses -> converged model, for the covariates of `data`."""
    S = [x.T @ x / len(x) for x in data.x]
    return {label: fixed_point_solver(S, sizes / sizes.sum(), eta, method, s) for label, (method, s) in ALGORITHMS.items()}


def gain_rows(data, solve: dict, pick: tuple[int, int], extra: dict) -> list[dict]:
    """FG of the picked scarce and rich clients against each algorithm's converged model."""
    b = [feature_stats(x, y)[1] for x, y in zip(data.x, data.y)]
    rows = []
    for label in ALGORITHMS:
        fl = solve[label](b)
        for client, j in zip(("scarce", "rich"), pick):
            fg = empirical_gain(local_estimator(data.x[j], data.y[j]), fl, data.theta[j])
            rows.append({**extra, "algorithm": label, "client": client, "fg": fg})
    return rows


def fig4_table(config: Path = CONFIGS / "kernel_fig4.yaml", gammas=GAMMAS, trials: int = 20) -> pd.DataFrame:
    """FG vs Gamma (Fig. 4), with the client's closed-form FG (`gain_gaussian`) beside each value; the same
    draws at every Gamma within a trial (common random numbers)."""
    cfg, p, params = _setup(config)
    eta = params.eta
    sizes = client_sizes(p.sizes, cfg.data.num_clients)
    rows = []
    for trial in range(trials):
        pick = _scarce_rich(sizes, p.dim, stream(cfg.seed, SETUP, trial, "figure:pick"))
        solve = None
        for gamma in gammas:  # the same covariates at every Gamma: factor the fixed-point maps once
            data = linear_model(sizes, p.dim, p.noise, gamma, p.heterogeneity_kind,
                                stream(cfg.seed, SETUP, trial, "figure:data"))
            assert data.theta is not None  # the linear model's theta*
            solve = solve or solvers(data, sizes, eta)
            theory = {client: gain_gaussian(data.theta, sizes, j, p.noise)
                      for client, j in zip(("scarce", "rich"), pick)}
            rows += [{**row, "closed_form": theory[row["client"]]}
                     for row in gain_rows(data, solve, pick, {"gamma": gamma, "trial": trial})]
    return pd.DataFrame(rows)


def fg_crossing(x: np.ndarray, fg: np.ndarray) -> float:
    """Where a decreasing mean-FG curve first falls below the break-even FG = 1 (Fig. 4): linear
    interpolation between the two grid points around it; nan if it never does."""
    below = np.flatnonzero(fg < 1.0)
    if len(below) == 0:
        return float("nan")
    i = below[0]
    if i == 0:
        return float(x[0])
    return float(x[i - 1] + (x[i] - x[i - 1]) * (fg[i - 1] - 1.0) / (fg[i - 1] - fg[i]))


def fig4_means(table: pd.DataFrame) -> pd.DataFrame:
    """Trial-mean FG per (client, gamma): one column per algorithm, and the closed form."""
    mean = table.groupby(["client", "gamma", "algorithm"], sort=False)["fg"].mean().unstack()
    closed = table.groupby(["client", "gamma"], sort=False)["closed_form"].mean()
    return mean.assign(**{"closed form": closed})


def fig4_crossings(table: pd.DataFrame) -> pd.DataFrame:
    """Gamma at FG = 1 of each client kind (rows) and algorithm or the closed form (columns), from the trial means."""
    mean = fig4_means(table)
    return pd.DataFrame({client: {col: fg_crossing(np.array(mean.loc[client].index), mean.loc[client][col].to_numpy())
                                  for col in mean.columns}
                         for client in ("scarce", "rich")}).T


def fig5_table(config: Path = CONFIGS / "kernel_fig5.yaml", ranks=RANKS, trials: int = 20) -> pd.DataFrame:
    """FG vs the covariate-subspace rank r (Fig. 5), step proportional to r (Cor. 2): the config's eta at its rank."""
    cfg, p, params = _setup(config)
    eta = params.eta / (p.rank or p.dim)
    sizes = client_sizes(p.sizes, cfg.data.num_clients)
    rows = []
    for trial in range(trials):
        pick = _scarce_rich(sizes, p.dim, stream(cfg.seed, SETUP, trial, "figure:pick"))
        for r in ranks:
            data = subspace_model(sizes, p.dim, r, p.noise, stream(cfg.seed, r, trial, "figure:data"))
            rows += gain_rows(data, solvers(data, sizes, eta * r), pick, {"rank": r, "trial": trial})
    return pd.DataFrame(rows)


def l2_gram(degree: int) -> np.ndarray:
    """int_{-1}^{1} x^a x^b dx = 2/(a+b+1) for a+b even, else 0: the exact Fig. 6 error e'He."""
    a = np.arange(degree + 1)
    s = a[:, None] + a[None, :]
    return np.where(s % 2 == 0, 2.0 / (s + 1), 0.0)


def fig6_table(config: Path = CONFIGS / "kernel_fig6.yaml", per_client=range(1, 11), trials: int = 500) -> pd.DataFrame:
    """Mean over trials of int |f_hat - U_5|^2 dx of each converged model, for n_i = 1..10 (Sec. 6.4, Fig. 6)."""
    cfg, p, params = _setup(config)
    M, kernel = cfg.data.num_clients, Monomial(params.degree)
    H = l2_gram(params.degree)
    rows = []
    for n in per_client:
        sizes = np.full(M, n)
        Phis = [kernel.features(polynomial_grid(i, M, n, p.grid)) for i in range(M)]
        S = [P.T @ P / n for P in Phis]
        solvers = {label: fixed_point_solver(S, sizes / sizes.sum(), params.eta, m, s)
                   for label, (m, s) in ALGORITHMS.items()}
        errors: dict[str, list[float]] = {label: [] for label in ALGORITHMS}
        for trial in range(trials):
            data = polynomial_model(sizes, p.noise, p.grid, stream(cfg.seed, n, trial, "figure:data"))
            assert data.theta is not None  # the polynomial model's theta*
            b = [P.T @ y / n for P, y in zip(Phis, data.y)]
            for label, solve in solvers.items():
                e = solve(b) - data.theta[0]
                errors[label].append(e @ H @ e)
        rows += [{"N": int(sizes.sum()), "algorithm": label, "mse": float(np.mean(v))} for label, v in errors.items()]
    return pd.DataFrame(rows)


def fig4(out: Path, trials: int = 20) -> list[Path]:
    table = fig4_table(trials=trials)
    write_frame(table, out / "fig4.parquet")
    print(fig4_means(table).to_string())
    print("Gamma at FG = 1 (linear interpolation):\n" + fig4_crossings(table).to_string())
    return [plot_gain(table, "gamma", "model heterogeneity Γ", out / "kernel_fig4.png",
                      f"Fig. 4: FG vs Γ (mean ± s.e., {trials} trials)")]


def fig5(out: Path, trials: int = 20) -> list[Path]:
    table = fig5_table(trials=trials)
    write_frame(table, out / "fig5.parquet")
    print(table.groupby(["client", "rank", "algorithm"], sort=False)["fg"].mean().unstack().to_string())
    return [plot_gain(table, "rank", "covariate subspace rank r", out / "kernel_fig5.png",
                      f"Fig. 5: FG vs r (mean ± s.e., {trials} trials)")]


def fig6(out: Path, trials: int = 500) -> list[Path]:
    table = fig6_table(trials=trials)
    write_frame(table, out / "fig6.parquet")
    print(table.assign(inv_mse=1 / table["mse"]).pivot(index="N", columns="algorithm", values="inv_mse").to_string())
    return [plot_inverse_mse(table, out / "kernel_fig6.png", "Fig. 6: polynomial regression")]


FIGURES: dict[str, Callable[..., list[Path]]] = {"fig1": fig1, "fig2": fig2, "fig3": fig3, "fig4": fig4, "fig5": fig5, "fig6": fig6, "general": general}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figure", choices=sorted(FIGURES))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--trials", type=int, default=None, help="sweeps only (default 20; Fig. 6: 500)")
    args = ap.parse_args()
    out = args.out or Path("runs/kernel_figures") / args.figure
    out.mkdir(parents=True, exist_ok=True)
    kw = {} if args.trials is None else {"trials": args.trials}
    with threadpool_limits(1):  # many small BLAS calls: threads only oversubscribe
        paths = FIGURES[args.figure](out, **kw)
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
