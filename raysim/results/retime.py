"""Re-time a finished run under another system model from its recorded per-client costs, without
retraining: every simulated-time column and Γ, exactly as a run under the new model would record them.

Exact because every draw of the system model is keyed by (seed, round, client, purpose) and the
algorithm never sees the system model; it holds only while the new model cannot change which clients
are kept (no deadline, no over-selection, the virtual clock), which `retime` checks.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raysim.config import ExperimentConfig, dump_config, load_config, parse_override
from raysim.contract import Cost
from raysim.errors import ConfigError, RunDirError
from raysim.results.tables import RunResult, new_run_dir
from raysim.storage.atomic import atomic_write_bytes, make_dir, write_text
from raysim.system import Ledger, SystemModel

CLIENT_COSTS = ("oracle_calls", "oracle_batches", "upload_vectors", "upload_bytes")
SERVER_COSTS = ("server_oracle_calls", "server_oracle_batches")
RETIMED_ROUNDS = ("sim_time", "gamma", "round_sim_time")
RETIMED_CLIENTS = ("compute_time", "upload_time", "finish_time")


def _check_exact(cfg: ExperimentConfig, which: str) -> None:
    """Refuse a system model under which the kept clients depend on the sampled times."""
    s = cfg.system
    why = ("a deadline" if s.stragglers.deadline is not None else "over-selection" if s.stragglers.over_select
           else "the real clock" if s.clock.mode != "virtual"
           else f"availability {s.availability.kind!r}" if s.availability.kind in ("markov", "diurnal", "trace") else None)
    if why is not None:
        raise ConfigError(f"system: {which} has {why}, so which clients are kept depends on the sampled times and"
                          " a retimed run would not be the run it claims to be; run the experiment under it instead")


def _table(df: Any) -> pa.Table:
    return pa.Table.from_pandas(df, preserve_index=False)


def _write_table(table: pa.Table, path: Path) -> None:
    atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp))


def retime(run_dir: str | Path, overrides: list[str] | dict, out: str | Path | None = None) -> RunResult:
    """Write `run_dir`'s results re-timed under its config with the `system.*` overrides to `out`
    (default runs/<name>-retimed-<time>) and return them; checkpoints and data are not copied."""
    run_dir = Path(run_dir)
    old = RunResult.load(run_dir)
    items = dict(map(parse_override, overrides)) if isinstance(overrides, list) else dict(overrides)
    outside = [k for k in items if not k.startswith("system.")]
    if outside:
        raise ConfigError(f"{outside[0]}: retime changes only system.* fields; other fields change the training, so run it")
    cfg = load_config(run_dir / "config.yaml")
    if cfg.schedule.scheduled:
        raise ConfigError(f"schedule.kind: {run_dir} ran {cfg.schedule.kind!r}, where the order of arrivals decides what"
                          " is trained; rerun it under the new system model instead of retiming it")
    new = load_config(run_dir / "config.yaml", items)
    _check_exact(cfg, "the recorded run")
    _check_exact(new, "the new system model")
    missing = [c for c in CLIENT_COSTS if c not in old.clients.columns] + [c for c in SERVER_COSTS if c not in old.rounds.columns]
    if missing:
        raise RunDirError(f"{run_dir}: recorded without {', '.join(missing)}; rerun it with this raysim to retime it")
    out = Path(out) if out is not None else new_run_dir(f"{cfg.name}-retimed")
    if out.resolve() == run_dir.resolve() or (out / "rounds.parquet").exists():
        raise RunDirError(f"--out {out}: holds a run already; give a new directory")
    make_dir(out)  # a file there is refused before the work

    ids = old.clients["client_id"].to_numpy()
    model = SystemModel(new.system, new.seed, max(new.data.num_clients, int(ids.max()) + 1 if ids.size else 0))
    ledger = Ledger()
    by_round = {int(r): g for r, g in old.clients.groupby("round", sort=False)} if len(old.clients) else {}
    rounds = old.rounds.copy()
    parts = {}
    for i, row in enumerate(rounds.itertuples(index=False)):
        t = int(row.round)
        group = by_round.get(t)
        clients = group["client_id"].to_numpy(np.int64) if group is not None else np.zeros(0, np.int64)
        costs = ([Cost(int(a), int(b), float(v), int(u)) for a, b, v, u in zip(*(group[c] for c in CLIENT_COSTS))]
                 if group is not None else [])
        server_cost = Cost(int(row.server_oracle_calls), int(row.server_oracle_batches))
        times = model.client_compute_times(t, clients, costs) if clients.size else np.zeros(0)
        dropped, _ = model.stragglers(clients, times, None)
        timing = model.close_round(t, clients, times, costs, server_cost, model.server_compute_time(t, server_cost), dropped)
        totals = ledger.add(timing, costs, server_cost)
        for col, value in (("sim_time", totals["sim_time"]), ("gamma", totals["gamma"]), ("round_sim_time", timing.round_time)):
            rounds.iat[i, rounds.columns.get_loc(col)] = value
        if group is not None:
            group = group.copy()
            group["compute_time"], group["upload_time"], group["finish_time"] = (
                timing.compute_time, timing.upload_time, timing.finish_time)
            parts[t] = group

    write_text(dump_config(new), out / "config.yaml")
    for t, group in parts.items():
        _write_table(_table(group), out / "clients.parquet" / f"round-{t:06d}.parquet")
    _write_table(_table(rounds), out / "rounds.parquet")
    info = {**old.info, "retimed_from": str(run_dir), "retime": {k: items[k] for k in items}}
    write_text(json.dumps(info, indent=2, default=str), out / "run.json")
    return RunResult.load(out)
