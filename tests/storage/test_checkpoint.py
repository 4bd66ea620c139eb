"""Checkpoint files: atomic saves summed by their writers, the manifest once complete, latest.json written at
commit, pruning to the newest ones, and the newest intact checkpoint found past damaged ones."""
import hashlib
import json
import logging
import pickle

import pytest

from raysim.errors import RunDirError
from raysim.storage import checkpoint
from raysim.storage.atomic import write_parquet


def _take(run_dir, round, commit=True):
    """A checkpoint of `round` as a run takes it: server and shard files, the manifest, then the commit."""
    folder = checkpoint.checkpoint_dir(run_dir, round)
    files = {**checkpoint.save(pickle.dumps({"round": round}), folder / "server.pkl"),
             **checkpoint.save(pickle.dumps({0: round}), checkpoint.shard_path(folder, 0))}
    checkpoint.write_manifest(folder, round, files)
    if commit:
        checkpoint.commit(run_dir, round)
    return folder


def test_latest_is_only_what_was_committed_and_old_ones_are_pruned(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    for r in (2, 4, 6):
        folder = checkpoint.checkpoint_dir(tmp_path, r)
        checkpoint.save(pickle.dumps({"round": r}), folder / "server.pkl")
        checkpoint.save(pickle.dumps({0: r}), checkpoint.shard_path(folder, 0))
    assert checkpoint.latest(tmp_path) is None  # saved but never declared complete: not a checkpoint yet
    _take(tmp_path, 4)
    round, folder = checkpoint.latest(tmp_path)
    assert round == 4 and checkpoint.load(folder / "server.pkl") == {"round": 4}
    assert checkpoint.checkpoint_dir(tmp_path, 6).exists()  # newer, uncommitted: kept
    _take(tmp_path, 6)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("round-*"))
    assert names == ["round-000004", "round-000006"]  # KEEP = 2
    assert checkpoint.load(checkpoint.shard_path(checkpoint.latest(tmp_path)[1], 0)) == {0: 6}
    assert not list((tmp_path / "checkpoints").rglob(".*"))  # no temporary files left behind


def test_latest_json_records_each_files_size_and_sha256(tmp_path):
    folder = _take(tmp_path, 3)
    latest = json.loads((tmp_path / "checkpoints" / "latest.json").read_text())
    assert latest["round"] == 3 and sorted(latest["files"]) == ["server.pkl", "shard-0000.pkl"]
    for name, want in latest["files"].items():
        payload = (folder / name).read_bytes()
        assert want == {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


def _truncate(path):
    path.write_bytes(path.read_bytes()[:5])


def _flip(path):
    payload = bytearray(path.read_bytes())
    payload[-3] ^= 0xFF
    path.write_bytes(bytes(payload))


@pytest.mark.parametrize("damage, why, used", [
    (lambda f, root: _truncate(f / "server.pkl"), "server.pkl has 5 bytes", 10),
    (lambda f, root: checkpoint.shard_path(f, 0).write_bytes(b""), "shard-0000.pkl has 0 bytes", 10),
    (lambda f, root: _flip(checkpoint.shard_path(f, 0)), "shard-0000.pkl does not match its checksum", 10),
    (lambda f, root: (f / "server.pkl").unlink(), "server.pkl is missing", 10),
    (lambda f, root: [p.unlink() for p in f.iterdir()] and f.rmdir(), "round 20: server.pkl is missing", 10),
    (lambda f, root: (root / "latest.json").write_text('{"round": 2'), "latest.json is unreadable", 20),  # manifests remain
])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, caplog, damage, why, used):
    _take(tmp_path, 10)
    newest = _take(tmp_path, 20)
    damage(newest, tmp_path / "checkpoints")
    with caplog.at_level(logging.WARNING, "raysim"):
        round, folder = checkpoint.latest(tmp_path)
    assert round == used and checkpoint.load(folder / "server.pkl") == {"round": used}
    [warning] = [r.getMessage() for r in caplog.records]
    assert why in warning and f"resuming from round {used}" in warning


def test_no_intact_checkpoint_is_one_error_naming_each(tmp_path):
    for r in (10, 20):
        _truncate(_take(tmp_path, r) / "server.pkl")
    with pytest.raises(RunDirError, match=r"no intact checkpoint \(round 20: server.pkl has 5 bytes.*; "
                                          r"round 10: server.pkl has 5 bytes.*\); nothing was changed"):
        checkpoint.latest(tmp_path)


def test_a_checkpoint_newer_than_the_tables_is_not_used(tmp_path):
    """Complete on disk but not committed (the tables were not flushed to its round): the one before it is used."""
    _take(tmp_path, 10)
    _take(tmp_path, 20, commit=False)
    write_parquet([{"round": r} for r in range(1, 16)], tmp_path / "rounds.parquet")
    assert checkpoint.latest(tmp_path)[0] == 10
    assert checkpoint.latest(tmp_path, reached=20)[0] == 20


def test_a_damaged_rounds_table_is_one_line(tmp_path):
    write_parquet([{"round": r} for r in range(1, 16)], tmp_path / "rounds.parquet")
    _truncate(tmp_path / "rounds.parquet")
    with pytest.raises(RunDirError, match=r"rounds.parquet: damaged, cannot be read \("):
        checkpoint.tables_reach(tmp_path)


def test_a_checkpoint_named_by_a_run_from_before_manifests_still_resumes(tmp_path):
    folder = checkpoint.checkpoint_dir(tmp_path, 5)
    checkpoint.save(pickle.dumps({"round": 5}), folder / "server.pkl")
    (tmp_path / "checkpoints" / "latest.json").write_text(json.dumps({"round": 5}))
    assert checkpoint.latest(tmp_path) == (5, folder)
