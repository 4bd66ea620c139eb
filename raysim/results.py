"""Run directories and result tables: atomic Parquet writes, and loading a run back with pandas."""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml


def atomic_write_bytes(path: Path, write) -> None:
    """Write through `write(tmp_path)` to a temporary file beside `path`, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(rows: list[dict], path: Path) -> None:
    """Rows as a Parquet table, atomically: a crash never leaves a half-written file."""
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp))


def write_text(text: str, path: Path) -> None:
    atomic_write_bytes(path, lambda tmp: Path(tmp).write_text(text))


def new_run_dir(name: str, root: Path = Path("runs")) -> Path:
    """`runs/<name>-<timestamp>/`, made unique if two runs start in the same second."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = root / f"{name}-{stamp}"
    path, i = base, 1
    while path.exists():
        path, i = Path(f"{base}-{i}"), i + 1
    path.mkdir(parents=True)
    return path


@dataclass
class RunResult:
    """A finished (or stopped) run: its directory and its tables as pandas DataFrames."""

    run_dir: Path
    rounds: pd.DataFrame
    clients: pd.DataFrame
    info: dict = field(default_factory=dict)

    @property
    def config(self) -> dict:
        return yaml.safe_load((self.run_dir / "config.yaml").read_text())

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunResult":
        """Open a run directory written by `raysim run`."""
        run_dir = Path(run_dir)
        if not (run_dir / "rounds.parquet").exists():
            raise FileNotFoundError(f"{run_dir} has no rounds.parquet: not a raysim run directory")
        info_path = run_dir / "run.json"
        info = json.loads(info_path.read_text()) if info_path.exists() else {}
        clients_path = run_dir / "clients.parquet"
        clients = pd.read_parquet(clients_path) if clients_path.exists() else pd.DataFrame()
        return cls(run_dir, pd.read_parquet(run_dir / "rounds.parquet"), clients, info)


class RunWriter:
    """Accumulates rows and rewrites the run's tables atomically after every round."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.rounds: list[dict] = []
        self.clients: list[dict] = []
        self.info: dict[str, Any] = {"status": "running"}

    def add(self, row: dict, client_rows: list[dict]) -> None:
        self.rounds.append(row)
        self.clients.extend(client_rows)
        write_parquet(self.rounds, self.run_dir / "rounds.parquet")
        write_parquet(self.clients, self.run_dir / "clients.parquet")

    def status(self, **info: Any) -> None:
        """Record run metadata (status, start-up times, error) in run.json."""
        self.info.update(info)
        write_text(json.dumps(self.info, indent=2, default=str), self.run_dir / "run.json")
