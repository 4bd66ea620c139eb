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

from raysim.atomic import atomic_write_bytes, write_text

KEEP = 2  # complete checkpoints kept on disk


def checkpoint_dir(run_dir: str | Path, round: int) -> Path:
    """Where the checkpoint taken after `round` lies."""
    return Path(run_dir) / "checkpoints" / f"round-{round:06d}"


def dumps(state: Any) -> bytes:
    """`state` pickled with Ray's cloudpickle, which carries the classes of modules the driver's
    plugins registered by value (raysim.plugins.snapshot)."""
    import ray.cloudpickle

    return ray.cloudpickle.dumps(state)


def save(payload: bytes, path: Path) -> None:
    """Write pickled state to `path` atomically."""
    atomic_write_bytes(path, lambda tmp: Path(tmp).write_bytes(payload))


def load(path: Path) -> Any:
    """The object pickled in `path`."""
    return pickle.loads(Path(path).read_bytes())


def shard_path(ckpt: Path, shard: int) -> Path:
    return ckpt / f"shard-{shard:04d}.pkl"


def client_states(ckpt: Path, clients: list[int]) -> dict[int, Any]:
    """The saved states of `clients`, whichever shards saved them: a run resumes with another
    packing of clients into actors, or on the other backend."""
    wanted, states = set(clients), dict[int, Any]()
    for path in sorted(Path(ckpt).glob("shard-*.pkl")):
        states.update((c, s) for c, s in load(path).items() if c in wanted)
    missing = wanted - states.keys()
    if missing:
        raise FileNotFoundError(f"checkpoint {ckpt}: no saved state for clients {sorted(missing)[:5]}")
    return states


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
