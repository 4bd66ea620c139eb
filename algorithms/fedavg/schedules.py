"""`raysim schedules`: FedBuff (Nguyen et al., 2022) and FedAsync (Xie et al., 2019) against synchronous FedAvg on
one problem, over the spread of client speeds: simulated time, Γ and wall time to a target test accuracy.

From a config with a buffered schedule (C clients at once, K arrivals an update, R updates), at each log-normal
speed spread sigma it runs: synchronous FedAvg with K clients a round (the same clients per update) and with C (the
same concurrency), R rounds each; the buffered schedule as configured; FedAsync with the same concurrency and R*K
updates (the same number of client updates applied).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd

from raysim.config import ExperimentConfig, load_config, parse_override
from raysim.errors import ConfigError
from raysim.storage.atomic import atomic_write_bytes, write_text


def variants(cfg: ExperimentConfig) -> list[tuple[str, int, int, dict[str, Any]]]:
    """(schedule, clients an update, clients at once, overrides) of each run for a buffered config."""
    if cfg.schedule.kind != "buffered":
        raise ConfigError(f"schedule.kind: schedules compares against a buffered schedule, got {cfg.schedule.kind!r}")
    s = cfg.schedule.resolved(cfg.algorithm.clients_per_round)
    assert s.concurrency is not None and s.buffer is not None  # resolved
    c, k, r, every = s.concurrency, s.buffer, cfg.algorithm.rounds, cfg.eval.every
    sync = {"schedule": {"kind": "sync"}}
    return [
        ("sync", k, k, {**sync, "algorithm.clients_per_round": k}),
        ("sync", c, c, {**sync, "algorithm.clients_per_round": c}),
        ("buffered", k, c, {}),
        ("async", 1, c, {"schedule": {"kind": "async", "concurrency": c, "alpha": s.alpha,
                                      "max_staleness": s.max_staleness},
                         "algorithm.rounds": r * k, "eval.every": every * k}),
    ]


def reach(rounds: pd.DataFrame, target: float) -> dict[str, Any]:
    """Updates, simulated time and Γ at the first evaluated update with test accuracy >= `target` (NaN if never)."""
    evaluated = rounds.dropna(subset=["test_accuracy"])
    hit = evaluated[evaluated["test_accuracy"] >= target]
    first = hit.iloc[0] if not hit.empty else None
    return {"reached": first is not None,
            **{name: float(first[col]) if first is not None else math.nan
               for name, col in (("updates", "round"), ("sim_time", "sim_time"), ("gamma", "gamma"))},
            "final_accuracy": float(evaluated["test_accuracy"].iloc[-1])}


def compare_schedules(config: str | Path, sigmas: tuple[float, ...], target: float, out: str | Path,
                      overrides: list[str] | None = None) -> pd.DataFrame:
    """Run every variant at every sigma under `out` and return the table (also written as schedules.parquet and
    schedules.md): `time_ratio` is the simulated time to the target over synchronous FedAvg's with K clients a round
    at the same sigma."""
    import raysim

    if not sigmas or any(s < 0 for s in sigmas):
        raise ValueError(f"sigma: give spreads >= 0, got {list(sigmas)}")
    out = Path(out)
    cfg = load_config(config, overrides or [])
    given = dict(map(parse_override, overrides or []))
    rows = []
    for sigma in sigmas:
        for kind, per_update, at_once, extra in variants(cfg):
            speed = {"system.compute.speed": "lognormal", "system.compute.speed_sigma": sigma}
            t0 = time.perf_counter()
            result = raysim.run(config, {**given, **speed, **extra}, out=out / f"sigma{sigma:g}-{kind}-{per_update}",
                                progress=False)
            rows.append({"sigma": sigma, "schedule": kind, "clients_per_update": per_update, "concurrency": at_once,
                         **reach(result.rounds, target), "wall_s": time.perf_counter() - t0})
    table = pd.DataFrame(rows)
    base = table[(table["schedule"] == "sync") & (table["clients_per_update"] == table["concurrency"])]
    base = base.groupby("sigma")["sim_time"].first()
    table["time_ratio"] = table["sim_time"] / table["sigma"].map(base)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "schedules.parquet", lambda tmp: table.to_parquet(tmp, index=False))
    write_text(markdown(table, target), out / "schedules.md")
    return table


def markdown(table: pd.DataFrame, target: float) -> str:
    """The table as GitHub markdown, times to test accuracy `target`."""
    head = ["sigma", "schedule", "clients an update", "at once", f"updates to {target:g}", "sim time",
            "Γ", "sim time / sync", "final acc.", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table.itertuples(index=False):
        cells = [f"{r.sigma:g}", r.schedule, str(r.clients_per_update), str(r.concurrency),
                 f"{r.updates:.0f}" if r.reached else "not reached", f"{r.sim_time:.0f}", f"{r.gamma:.0f}",
                 f"{r.time_ratio:.3f}", f"{r.final_accuracy:.3f}", f"{r.wall_s:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
