"""`raysim oneshot`: run several one-shot methods over several seeds on one config and tabulate them.

Each (method, seed) is one run of the runtime; for a seed every method trains the identical local
models (same streams), as in the paper's code (the FedFisher paper). The table (Parquet and
markdown, mean ± population std over seeds; the paper does not say which) and a bar chart go to the output folder.
"""
from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd

from raysim.config import AlgorithmConfig, ConfigError
from raysim.plugins import ALGORITHMS

METHODS: dict[str, tuple[str, dict]] = {
    "fedavg": ("oneshot_fedavg", {}),
    "fisher_merge": ("fisher_merge", {}),
    "regmean": ("regmean", {}),
    "fedfisher_diag": ("fedfisher", {"fisher": "diag"}),
    "fedfisher_kfac": ("fedfisher", {"fisher": "kfac"}),
    "otfusion": ("otfusion", {}),
    "pfnm": ("pfnm", {}),
    "dense": ("dense", {}),
}


def method_config(tree: dict, method: str, seed: int) -> dict:
    """The config tree for one method: its algorithm name and fixed settings, the seed, and only those
    algorithm keys of `tree` that the method's Params accept (shared keys such as local_epochs). A key that no
    one-shot method accepts is a mistake (ConfigError naming it), not left out."""
    if method not in METHODS:
        raise ConfigError(f"--methods: unknown method {method!r}; allowed: {', '.join(sorted(METHODS))}")
    name, fixed = METHODS[method]
    tree = copy.deepcopy(tree)
    section = tree.get("algorithm") or {}
    known = set(AlgorithmConfig.model_fields).union(*(ALGORITHMS.lookup(n).Params.model_fields
                                                       for n, _ in METHODS.values()))
    unknown = sorted(k for k in section if k not in known)
    if unknown:
        raise ConfigError(f"algorithm.{unknown[0]}: unknown field (no one-shot method takes it)")
    accepted = set(AlgorithmConfig.model_fields) | set(ALGORITHMS.lookup(name).Params.model_fields)
    tree["algorithm"] = {**{k: v for k, v in section.items() if k in accepted}, "name": name, **fixed}
    tree["seed"] = seed
    return tree


def compare(config: str | Path | dict, methods: list[str], seeds: list[int], out: str | Path,
            overrides: list[str] | None = None, address: str | None = None) -> pd.DataFrame:
    """Run every method for every seed into out/<method>-seed<seed>/ and write out/oneshot.{parquet,md,png}."""
    from raysim.config import apply_overrides, parse_override, read_config_file
    from raysim.algorithms.fedfisher.plots import write_comparison
    from raysim.storage.atomic import write_parquet
    from raysim.runner import ensure_ray, run
    import ray

    tree = copy.deepcopy(config) if isinstance(config, dict) else read_config_file(config)
    if not isinstance(tree, dict):
        raise ConfigError("expected a mapping of sections (data:, model:, algorithm:, ...)", str(config))
    tree = apply_overrides(tree, dict(map(parse_override, overrides or [])))
    trees = {(m, s): method_config(tree, m, s) for m in methods for s in seeds}  # fail before any run
    out = Path(out)
    from raysim.config import load_config

    started = ensure_ray(load_config(trees[methods[0], seeds[0]]), address)
    rows = []
    try:
        for (method, seed), t in trees.items():
            result = run(t, out=out / f"{method}-seed{seed}", address=address)
            last = result.rounds.iloc[-1]
            clients = result.clients
            rows.append({"method": method, "seed": seed, "rounds": int(last["round"]),
                         "test_accuracy": float(last["test_accuracy"]), "test_loss": float(last["test_loss"]),
                         "client_oracle_calls": int(clients["oracle_calls"].sum()),
                         "client_cpu_s": float(clients["cpu_s"].mean()),
                         "upload_bytes": int(clients["upload_bytes"].sum()),
                         "sim_time": float(last["sim_time"]), "wall_s": float(last["wall_s"])})
    finally:
        if started:
            ray.shutdown()
    table = pd.DataFrame(rows)
    write_parquet(rows, out / "oneshot.parquet")
    write_comparison(table, out)
    return table
