"""Take the trained model out of a run: the server state of its newest checkpoint (or of the best round kept
by the `best_model` callback), turned into the algorithm's model by `Algorithm.export` and saved as a torch
`state_dict` (`.pt`, loads into `raysim.models.build_model` of the run's model config) or a `.npz` of arrays.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysim import checkpoint
from raysim.config import ExperimentConfig, load_config
from raysim.data import FederatedData, build_federated
from raysim.errors import RunDirError
from raysim.atomic import atomic_write_bytes, write_text

FEDERATED_JSON = "federated.json"


def save_federated(fed: FederatedData, data_dir: Path) -> None:
    """Record where the run's data lie (paths relative to `data_dir` when inside it, so a moved run still opens)."""
    d = fed.to_dict()
    for key in ("train_path", "test_path"):
        path = Path(d[key])
        if path.resolve().is_relative_to(data_dir.resolve()):
            d[key] = str(path.resolve().relative_to(data_dir.resolve()))
    write_text(json.dumps(d, indent=2), data_dir / FEDERATED_JSON)


def load_federated(run_dir: Path, cfg: ExperimentConfig) -> FederatedData:
    """The run's federated data; rebuilt (deterministically, the same files) for a run that predates federated.json."""
    data_dir = run_dir / "data"
    meta = data_dir / FEDERATED_JSON
    if not meta.exists():
        return build_federated(cfg.data, cfg.seed, data_dir)
    d = json.loads(meta.read_text())
    for key in ("train_path", "test_path"):
        if not Path(d[key]).is_absolute():
            d[key] = str(data_dir / d[key])
    return FederatedData.from_dict(d)


@dataclass
class Trained:
    """A run's trained model (`Algorithm.export` of its server state) and the round that state is from."""

    model: Any
    round: int


def trained_model(run_dir: str | Path, best: bool = False) -> Trained:
    """The model after the run's newest checkpoint, or after its best round (`best=True`, kept by the
    `best_model` callback)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise RunDirError(f"{run_dir} has no config.yaml: not a raysim run directory")
    if best:
        folder = run_dir / "best_model"
        if not (folder / "server.pkl").exists():
            raise RunDirError(f"{run_dir} has no best_model/server.pkl: run with "
                              "callbacks: [{kind: best_model, metric: test_accuracy}] to keep the best round")
        state, round = checkpoint.load(folder / "server.pkl"), int(json.loads((folder / "best.json").read_text())["round"])
    else:
        found = checkpoint.latest(run_dir)
        if found is None:
            raise RunDirError(f"{run_dir} has no checkpoint to export (checkpoint.every: 0, or it stopped before the "
                              "first): run with checkpoint.every > 0, or keep the best round with the best_model callback")
        round, folder = found
        state, _ledger = checkpoint.load(folder / "server.pkl")
    from raysim.experiment import make_algorithm  # torch and the families: only when a model is taken out

    cfg = load_config(run_dir / "config.yaml")
    return Trained(make_algorithm(cfg, load_federated(run_dir, cfg)).export(state), round)


def export(run_dir: str | Path, out: str | Path | None = None, best: bool = False) -> tuple[Path, Trained]:
    """Write the run's trained model to `out` (default RUN/model.pt, or RUN/model.npz for array exports),
    atomically; returns the path and what was written."""
    import torch

    trained = trained_model(run_dir, best)
    is_module = isinstance(trained.model, torch.nn.Module)
    path = Path(out) if out is not None else Path(run_dir) / ("model.pt" if is_module else "model.npz")
    if is_module:
        atomic_write_bytes(path, lambda tmp: torch.save(trained.model.state_dict(), tmp))
    else:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **trained.model)
        atomic_write_bytes(path, write)
    return path, trained
