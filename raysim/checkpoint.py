"""Checkpoints of a run: server state and every shard's client states at a round boundary.

Layout: `RUN/checkpoints/round-000010/server.pkl` and `shard-0003.pkl`, each written atomically;
`RUN/checkpoints/latest.json` names the newest complete checkpoint and is written last, so a
crash while saving leaves the previous checkpoint in force. Random draws are keyed by round
(raysim.rng), so state at a round boundary is all a run needs to continue bit for bit.
"""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

from raysim.results import atomic_write_bytes, write_text

KEEP = 2  # complete checkpoints kept on disk


def checkpoint_dir(run_dir: str | Path, round: int) -> Path:
    """Where the checkpoint taken after `round` lies."""
    return Path(run_dir) / "checkpoints" / f"round-{round:06d}"


def save(payload: bytes, path: Path) -> None:
    """Write pickled state to `path` atomically (actors pickle with Ray's cloudpickle, which also
    carries classes defined outside raysim by value)."""
    atomic_write_bytes(path, lambda tmp: Path(tmp).write_bytes(payload))


def load(path: Path) -> Any:
    """The object pickled in `path`."""
    return pickle.loads(Path(path).read_bytes())


def shard_path(ckpt: Path, shard: int) -> Path:
    return ckpt / f"shard-{shard:04d}.pkl"


def commit(run_dir: str | Path, round: int) -> None:
    """Mark the checkpoint of `round` complete and delete all but the newest `KEEP`."""
    root = Path(run_dir) / "checkpoints"
    write_text(json.dumps({"round": round}), root / "latest.json")
    done = sorted(p for p in root.glob("round-*") if int(p.name.removeprefix("round-")) <= round)
    for old in done[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def latest(run_dir: str | Path) -> tuple[int, Path] | None:
    """(round, folder) of the newest complete checkpoint, or None."""
    marker = Path(run_dir) / "checkpoints" / "latest.json"
    if not marker.exists():
        return None
    round = int(json.loads(marker.read_text())["round"])
    return round, checkpoint_dir(run_dir, round)
