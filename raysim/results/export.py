"""Take the trained model out of a run: the server state of its newest checkpoint (or of the best round kept
by the `best_model` callback), turned into the algorithm's model by `Algorithm.export` and saved as a torch
`state_dict` (`.pt`, loads into `raysim.models.build_model` of the run's model config) or a `.npz` of arrays:
every array of the model, nested ones under dotted names, or a one-line refusal, never a partial file.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysim.config import ExperimentConfig, load_config
from raysim.data import FederatedData, build_federated
from raysim.errors import ExportError, RunDirError
from raysim.storage import checkpoint
from raysim.storage.atomic import atomic_write_bytes, write_text

FEDERATED_JSON = "federated.json"
PATHS = ("train_path", "test_path", "local_test_path")  # federated.json's paths, relative to the data folder


def save_federated(fed: FederatedData, data_dir: Path) -> None:
    """Record where the run's data lie (paths relative to `data_dir` when inside it, so a moved run still opens)."""
    d = fed.to_dict()
    for key in PATHS:
        if d[key] is None:
            continue
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
    for key in PATHS:
        if d.get(key) is not None and not Path(d[key]).is_absolute():
            d[key] = str(data_dir / d[key])
    return FederatedData.from_dict(d)


def model_arrays(model: Any, run_dir: str | Path) -> dict[str, np.ndarray]:
    """`Algorithm.export`'s mapping (or dataclass) as {name: array}, ready for `np.savez`: a nested mapping or
    dataclass is flattened to dotted names (`representer.alpha`), a torch tensor taken to numpy, a None (an unset
    optional field) left out. Anything else that is no plain array (an arbitrary object, ragged sequences) raises
    ExportError naming `run_dir` and the value: an object array would need pickle to load, and dropping it would
    leave a file that is not the whole model."""
    arrays: dict[str, np.ndarray] = {}

    def add(name: str, value: Any) -> None:
        if value is None:
            return
        if isinstance(value, Mapping):
            items = [(str(k), v) for k, v in value.items()]
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
        else:
            if not name:
                raise ExportError(f"{run_dir}: the model is a {type(value).__name__}, not a mapping of arrays "
                                  "or an nn.Module: nothing to write")
            if hasattr(value, "detach"):
                value = value.detach().cpu().numpy()
            try:
                array: np.ndarray | None = np.asarray(value)
            except ValueError:  # ragged sequences
                array = None
            if array is None or array.dtype == object:
                raise ExportError(f"{run_dir}: cannot export {name!r} of the model ({type(value).__name__}): "
                                  "not an array of numbers or strings")
            if name in arrays:
                raise ExportError(f"{run_dir}: cannot export the model: two of its values are named {name!r}")
            arrays[name] = array
            return
        for key, item in items:
            add(f"{name}.{key}" if name else key, item)

    add("", model)
    if not arrays:
        raise ExportError(f"{run_dir}: the model has no arrays to export")
    return arrays


@dataclass
class Trained:
    """A run's trained model (`Algorithm.export` of its server state: an nn.Module, or `model_arrays` of it)
    and the round that state is from."""

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
    import torch

    from raysim.round.experiment import make_algorithm  # torch and the families: only when a model is taken out

    cfg = load_config(run_dir / "config.yaml")
    model = make_algorithm(cfg, load_federated(run_dir, cfg)).export(state)
    return Trained(model if isinstance(model, torch.nn.Module) else model_arrays(model, run_dir), round)


def export(run_dir: str | Path, out: str | Path | None = None, best: bool = False) -> tuple[Path, Trained]:
    """Write the run's trained model to `out` (default RUN/model.pt, or RUN/model.npz for array exports; into a
    directory `out` under that name), atomically; returns the path and what was written. A model that is not all
    arrays raises ExportError (see `model_arrays`) before anything is written."""
    import torch

    trained = trained_model(run_dir, best)
    is_module = isinstance(trained.model, torch.nn.Module)
    name = "model.pt" if is_module else "model.npz"
    path = Path(run_dir) / name if out is None else Path(out) / name if Path(out).is_dir() else Path(out)
    if is_module:
        atomic_write_bytes(path, lambda tmp: torch.save(trained.model.state_dict(), tmp))
    else:
        def write(tmp: str) -> None:
            with open(tmp, "wb") as f:
                np.savez(f, **trained.model)
        atomic_write_bytes(path, write)
    return path, trained
