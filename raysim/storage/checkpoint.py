"""Checkpoints of a run: server state and every shard's client states at a round boundary.

Layout: `RUN/checkpoints/round-000010/server.pkl` and `shard-0003.pkl`, each written atomically and
summed (size and SHA-256) by its writer; `manifest.json` lists the sums once every file is written, and
`RUN/checkpoints/latest.json` (the manifest again) names the newest committed checkpoint, written once the
run's tables reach its round. A resume takes the newest checkpoint whose files match their sums and whose
round the tables reach (`latest`), so a crash while saving, or a damaged file, leaves an older one in force.
Random draws are keyed by round (raysim.core.rng), so state at a round boundary is all a run needs to continue bit for bit.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pickle
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raysim.errors import RunDirError
from raysim.storage.atomic import atomic_write_bytes, read_or_refuse, write_text

KEEP = 2  # complete checkpoints kept on disk
MANIFEST = "manifest.json"
LOGGER = logging.getLogger("raysim")


def checkpoint_dir(run_dir: str | Path, round: int) -> Path:
    """Where the checkpoint taken after `round` lies."""
    return Path(run_dir) / "checkpoints" / f"round-{round:06d}"


def dumps(state: Any) -> bytes:
    """`state` pickled with Ray's cloudpickle, which carries the classes of modules the driver's
    plugins registered by value (raysim.plugins.snapshot)."""
    import ray.cloudpickle

    return ray.cloudpickle.dumps(state)


def _sum(payload: bytes) -> dict[str, Any]:
    return {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def save(payload: bytes, path: Path) -> dict[str, dict[str, Any]]:
    """Write pickled state to `path` atomically; returns {file name: its size and SHA-256} for the manifest."""
    atomic_write_bytes(path, lambda tmp: Path(tmp).write_bytes(payload))
    return {path.name: _sum(payload)}


def load(path: Path) -> Any:
    """The object pickled in `path`."""
    return pickle.loads(Path(path).read_bytes())


def shard_path(ckpt: Path, shard: int) -> Path:
    return ckpt / f"shard-{shard:04d}.pkl"


def client_states(ckpt: Path, clients: Sequence[int]) -> dict[int, Any]:
    """The saved states of `clients`, whichever shards saved them: a run resumes with another packing of clients
    into actors, or on the other backend. A shard saves only the states its steps set (every other client's is its
    `client_init` state), so a client may have none; the manifest's sums vouch that no shard's file is missing."""
    wanted = clients if isinstance(clients, range) else set(clients)
    states = dict[int, Any]()
    for path in sorted(Path(ckpt).glob("shard-*.pkl")):
        states.update((c, s) for c, s in load(path).items() if c in wanted)
    return states


def write_manifest(folder: Path, round: int, files: dict[str, dict[str, Any]]) -> None:
    """Declare the checkpoint in `folder` complete: every file it needs, with the sums its writers reported."""
    write_text(json.dumps({"round": round, "files": files}, indent=1, sort_keys=True), folder / MANIFEST)


def commit(run_dir: str | Path, round: int) -> None:
    """Name the (complete) checkpoint of `round` in latest.json, with its files' sums, once the run's tables
    reach that round; delete all but the newest `KEEP`."""
    root = Path(run_dir) / "checkpoints"
    write_text((checkpoint_dir(run_dir, round) / MANIFEST).read_text(), root / "latest.json")
    done = sorted(p for p in root.glob("round-*") if int(p.name.removeprefix("round-")) <= round)
    for old in done[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


def _damage(folder: Path, files: dict[str, dict[str, Any]]) -> str | None:
    """What is wrong with the checkpoint in `folder` against its sums (None: intact). No sums: a checkpoint
    named by a run from before manifests, taken as intact if its server state is there."""
    for name, want in sorted((files or {"server.pkl": {}}).items()):
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if not want:
            continue
        payload = path.read_bytes()
        if len(payload) != want["bytes"]:
            return f"{name} has {len(payload)} bytes, {want['bytes']} were written"
        if hashlib.sha256(payload).hexdigest() != want["sha256"]:
            return f"{name} does not match its checksum"
    return None


def _manifest(path: Path) -> dict[str, Any] | str:
    """The manifest in `path` ({"round", "files"}), or what is wrong with it."""
    try:
        found = json.loads(path.read_text())
        return {"round": int(found["round"]), "files": dict(found.get("files", {}))}
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{path.name} is unreadable ({type(e).__name__})"


def tables_reach(run_dir: str | Path) -> int | None:
    """The last round in the run's rounds.parquet (None: it has none); RunDirError if the file is damaged."""
    import pyarrow.parquet as pq

    path = Path(run_dir) / "rounds.parquet"
    if not path.exists():
        return None
    rounds = read_or_refuse(path, lambda: pq.read_table(path, columns=["round"]).column("round").to_pylist())
    return max(rounds, default=0)


def latest(run_dir: str | Path, reached: int | None = None) -> tuple[int, Path] | None:
    """(round, folder) of the newest intact checkpoint whose round the run's tables reach (`reached`: their
    last round, read from rounds.parquet when not given), or None when the run has none. Damaged newer ones are named in one warning line;
    if checkpoints exist and none is intact, RunDirError says so (and the caller changes nothing)."""
    root = Path(run_dir) / "checkpoints"
    reached = tables_reach(run_dir) if reached is None else reached
    manifests: dict[int, dict[str, Any] | str] = {}
    damaged: list[str] = []
    if (root / "latest.json").exists():
        named = _manifest(root / "latest.json")
        if isinstance(named, str):
            damaged.append(named)
        else:
            manifests[named["round"]] = named
    for folder in root.glob("round-*"):
        if (folder / MANIFEST).exists():
            manifests.setdefault(int(folder.name.removeprefix("round-")), _manifest(folder / MANIFEST))
    for round in sorted(manifests, reverse=True):
        if reached is not None and round > reached:
            continue  # saved but not committed: the tables stop before it
        found = manifests[round]
        problem = found if isinstance(found, str) else _damage(checkpoint_dir(run_dir, round), found["files"])
        if problem is None:
            if damaged:
                LOGGER.warning("%s: damaged checkpoint (%s); resuming from round %d", root, "; ".join(damaged), round)
            return round, checkpoint_dir(run_dir, round)
        damaged.append(f"round {round}: {problem}")
    if damaged:
        raise RunDirError(f"{root}: no intact checkpoint ({'; '.join(damaged)}); nothing was changed")
    return None
