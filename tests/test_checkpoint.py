"""Checkpoint files: atomic saves, the commit marker written last, pruning to the newest ones."""
import pickle

from raysim import checkpoint


def test_latest_is_only_what_was_committed_and_old_ones_are_pruned(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    for r in (2, 4, 6):
        folder = checkpoint.checkpoint_dir(tmp_path, r)
        checkpoint.save(pickle.dumps({"round": r}), folder / "server.pkl")
        checkpoint.save(pickle.dumps({0: r}), checkpoint.shard_path(folder, 0))
    assert checkpoint.latest(tmp_path) is None  # saved but never committed: not a checkpoint yet
    checkpoint.commit(tmp_path, 4)
    round, folder = checkpoint.latest(tmp_path)
    assert round == 4 and checkpoint.load(folder / "server.pkl") == {"round": 4}
    assert checkpoint.checkpoint_dir(tmp_path, 6).exists()  # newer, uncommitted: kept
    checkpoint.commit(tmp_path, 6)
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("round-*"))
    assert names == ["round-000004", "round-000006"]  # KEEP = 2
    assert checkpoint.load(checkpoint.shard_path(checkpoint.latest(tmp_path)[1], 0)) == {0: 6}
    assert not list((tmp_path / "checkpoints").rglob(".*"))  # no temporary files left behind
