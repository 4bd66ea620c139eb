"""`raysim compare`: run algorithms on one problem to target accuracies ε and tabulate what it cost.

For each experiment file, the FedAvg family (fedavg, fedprox) runs once per number of local steps
b (b ∈ {1, 5, 10, 20, 50}, as in the README); any other algorithm runs once. A run reaches ε at the first
round whose `train_objective` F(θ_t) (the full empirical risk of the algorithm's problem: the whole
pooled training set, and FedLRGD's server samples) is within ε of F* = min F. F* is computed here
by damped Newton in float64 on the algorithm's own `objective` (exact for ridge, to machine
precision for logistic regression). Each run serves every ε. The table (one row per run and ε:
Γ, simulated time and rounds at that round, final suboptimality) is written as `compare.parquet`
and `compare.md` in the output folder, next to the runs.
"""
from __future__ import annotations

import math
from pathlib import Path
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd
import torch

from raysim.config import ExperimentConfig, load_config
from raysim.data import build_federated, read_table_arrays
from raysim.errors import ConfigError
from raysim.models import ParamSpec
from raysim.round.experiment import make_algorithm
from raysim.storage.atomic import atomic_write_bytes, write_text

FEDAVG_FAMILY = ("fedavg", "fedprox")
DEFAULT_B = (1, 5, 10, 20, 50)
MAX_NEWTON_PARAMS = 5000


@runtime_checkable
class HasObjective(Protocol):
    """An algorithm whose model has a flat parameter vector and an objective F(θ) on data (LocalSGD, FedLRGD)."""

    spec: ParamSpec

    def objective(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...


def newton_minimum(objective, theta0: torch.Tensor, tol: float = 1e-13, max_iter: int = 100) -> tuple[torch.Tensor, float]:
    """(θ*, F*) of a smooth strongly convex `objective(θ)` by Newton steps with backtracking, in float64."""
    theta = theta0.to(torch.float64).clone()
    value = float(objective(theta))
    for _ in range(max_iter):
        g = torch.func.grad(objective)(theta)
        if float(g.norm()) < tol:
            break
        step = torch.linalg.solve(torch.func.hessian(objective)(theta), g)
        t = 1.0
        while t > 1e-12:
            candidate = theta - t * step
            new = float(objective(candidate))
            if new <= value:
                break
            t *= 0.5
        if new >= value and t <= 1e-12:
            break
        theta, value = candidate, new
    return theta, value


def optimum(cfg: ExperimentConfig, work_dir: Path) -> tuple[float, int]:
    """(F*, number of training samples) of the problem of `cfg`, from its federated data built in `work_dir`."""
    fed = build_federated(cfg.data, cfg.seed, work_dir)
    if cfg.eval.train_samples < fed.num_train:
        raise ValueError(f"eval.train_samples: {cfg.eval.train_samples} < {fed.num_train} training samples; "
                         "compare needs F(θ) on the whole pooled training set (raise eval.train_samples)")
    algo = make_algorithm(cfg, fed)
    if not isinstance(algo, HasObjective):
        raise ConfigError(f"algorithm.name: {cfg.algorithm.name!r} defines no objective(θ, x, y) to minimise")
    p = algo.spec.size
    if p > MAX_NEWTON_PARAMS:
        raise ValueError(f"model: {p} parameters; compare computes F* by Newton for at most {MAX_NEWTON_PARAMS}")
    x_np, y_np = read_table_arrays(fed.train_path)
    x, y = torch.as_tensor(np.array(x_np)), torch.as_tensor(np.array(y_np))
    _, f_star = newton_minimum(lambda th: algo.objective(th, x, y), torch.zeros(p, dtype=torch.float64))
    return f_star, fed.num_train


def reach(rounds: pd.DataFrame, f_star: float, epsilon: float) -> dict:
    """Γ, simulated time and rounds at the first round with F(θ_t) − F* ≤ ε (NaN if never), and the final gap."""
    gap = rounds["train_objective"] - f_star
    hit = rounds[gap <= epsilon]
    row = {"reached": not hit.empty, "final_suboptimality": float(gap.dropna().iloc[-1])}
    first = hit.iloc[0] if not hit.empty else None
    for col in ("round", "gamma", "sim_time"):
        row[col] = float(first[col]) if first is not None else math.nan
    return row


def variants(cfg: ExperimentConfig, b_values: tuple[int, ...]) -> list[tuple[int | None, dict]]:
    """(b, overrides) per run: one per b for the FedAvg family, a single run otherwise."""
    if cfg.algorithm.name in FEDAVG_FAMILY:
        return [(b, {"algorithm.local_steps": b, "algorithm.local_epochs": None}) for b in b_values]
    return [(None, {})]


def tabulate(rows: list[dict]) -> pd.DataFrame:
    """The ε-table of `rows` (one per run and ε), largest ε first, with `gamma_over_best_fedavg`: Γ over the
    least Γ of a FedAvg-family run that reached the same ε (NaN where none did)."""
    table = pd.DataFrame(rows).rename(columns={"round": "rounds"})
    table = table.sort_values("epsilon", ascending=False, kind="stable", ignore_index=True)
    fedavg = table["algorithm"].isin(FEDAVG_FAMILY) & table["reached"]
    best = table["epsilon"].map(table[fedavg].groupby("epsilon")["gamma"].min())
    table["gamma_over_best_fedavg"] = table["gamma"] / best
    return table


def markdown(table: pd.DataFrame) -> str:
    """The table as a GitHub markdown table."""
    cols = list(table.columns)
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def compare(configs: Sequence[str | Path], epsilons: float | tuple[float, ...], out: str | Path,
            b_values: tuple[int, ...] = DEFAULT_B, overrides: list[str] | None = None,
            address: str | None = None) -> pd.DataFrame:
    """Run every config (FedAvg family over `b_values`) once and return the table for every ε in
    `epsilons` (`gamma_over_best_fedavg` against the best FedAvg-family Γ at the same ε); writes it under `out`."""
    import ray

    from raysim.runner import ray_session
    from raysim.runner import run

    epsilons = (epsilons,) if isinstance(epsilons, (int, float)) else tuple(epsilons)
    if not epsilons or not all(e > 0 for e in epsilons):
        raise ValueError(f"epsilon: every target must be > 0, got {list(epsilons)}")
    cfgs = [load_config(c, overrides or []) for c in configs]  # every config checked before anything is made
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = ray_session.ensure(address or cfgs[0].cluster.address, cfgs[0].cluster.num_cpus)
    rows = []
    try:
        for path, cfg in zip(configs, cfgs):
            f_star, n = optimum(cfg, out / f"{cfg.name}-optimum")
            for b, extra in variants(cfg, b_values):
                name = cfg.name if b is None else f"{cfg.name}-b{b}"
                result = run(path, [*(overrides or []), *(f"{k}={v if v is not None else 'null'}" for k, v in extra.items())],
                             out=out / name)
                rows += [{"config": cfg.name, "algorithm": cfg.algorithm.name, "b": b if b is not None else -1,
                          **reach(result.rounds, f_star, e), "f_star": f_star, "samples": n, "epsilon": e}
                         for e in epsilons]
    finally:
        if started:
            ray.shutdown()
    table = tabulate(rows)
    atomic_write_bytes(out / "compare.parquet", lambda tmp: table.to_parquet(tmp, index=False))
    write_text(markdown(table), out / "compare.md")
    return table
