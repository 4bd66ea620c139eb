"""build_federated and the readers: file layout, determinism, stratified test set, filtered reads."""
from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raysim.data import DataConfig, FederatedData, build_federated, read_client_block, read_clients, read_rows, read_table_arrays
from raysim.data import federated


def digits(tmp_path, kind="iid", seed=0, num_clients=10, **kw) -> FederatedData:
    cfg = DataConfig(source="digits", num_clients=num_clients, partition={"kind": kind}, **kw)
    return build_federated(cfg, seed, tmp_path / f"{kind}-{seed}")


def test_files_schema_sizes_and_sorted_clients(tmp_path):
    fd = digits(tmp_path)
    assert sorted(p.name for p in fd.train_path.parent.iterdir()) == ["client_sizes.npy", "test.parquet", "train.parquet"]
    schema = pq.read_schema(fd.train_path)
    assert schema.field("client_id").type == pa.int64() and schema.field("y").type == pa.int64()
    assert schema.field("x").type == pa.list_(pa.float32(), 64)
    train, test = pq.read_table(fd.train_path), pq.read_table(fd.test_path)
    assert train.schema.equals(test.schema)
    cid = train.column("client_id").to_numpy()
    assert np.all(np.diff(cid) >= 0)
    assert np.array_equal(np.bincount(cid), fd.client_sizes) and fd.client_sizes.sum() == fd.num_train
    assert np.all(test.column("client_id").to_numpy() == -1)
    assert (fd.num_train, fd.num_test, len(train), len(test)) == (1438, 359, 1438, 359)
    assert (fd.feature_shape, fd.image_shape, fd.num_classes) == ((64,), (1, 8, 8), 10)


def test_test_set_is_stratified_and_independent_of_the_partition(tmp_path):
    fd = digits(tmp_path)
    _, y_test = read_table_arrays(fd.test_path)
    _, y_train = read_table_arrays(fd.train_path)
    per_class = np.bincount(np.concatenate([y_train, y_test]))
    assert np.all(np.abs(np.bincount(y_test) - 0.2 * per_class) < 1)
    x_other, y_other = read_table_arrays(digits(tmp_path, kind="dirichlet").test_path)
    x_test, _ = read_table_arrays(fd.test_path)
    assert np.array_equal(x_test, x_other) and np.array_equal(y_test, y_other)


def test_deterministic_given_seed(tmp_path):
    a, b, c = digits(tmp_path, seed=3), digits(tmp_path / "again", seed=3), digits(tmp_path, seed=4)
    assert pq.read_table(a.train_path).equals(pq.read_table(b.train_path))
    assert pq.read_table(a.test_path).equals(pq.read_table(b.test_path))
    assert not pq.read_table(a.train_path).equals(pq.read_table(c.train_path))


def test_partition_seed_fixes_the_data_across_experiment_seeds(tmp_path):
    """As the FedFisher paper's code does: with data.partition_seed the split is the same for every experiment seed."""
    a = digits(tmp_path / "a", kind="dirichlet", seed=0, partition_seed=3)
    b = digits(tmp_path / "b", kind="dirichlet", seed=7, partition_seed=3)
    c = digits(tmp_path / "c", kind="dirichlet", seed=3)
    for path in ("train_path", "test_path"):
        assert pq.read_table(getattr(a, path)).equals(pq.read_table(getattr(b, path)))
        assert pq.read_table(getattr(a, path)).equals(pq.read_table(getattr(c, path)))


def _client_rows(path) -> dict[int, np.ndarray]:
    """Each client's rows of a federated file as one sorted array of (features, label) rows."""
    cid, x, y = federated._table_arrays(pq.read_table(path))
    rows = np.column_stack([x.reshape(len(x), -1), y])
    return {int(c): np.unique(rows[cid == c], axis=0) for c in np.unique(cid)}


def test_each_client_holds_out_a_stratified_local_test_split_of_its_training_rows(tmp_path):
    """data.local_test_fraction: floor(0.25 n_c) of each client's training rows, apportioned over its labels (each
    label's count within 1 of 0.25 of the client's), and the two files together are the unsplit build's rows; the
    server's test set is untouched."""
    whole = digits(tmp_path, kind="dirichlet")
    split = digits(tmp_path / "split", kind="dirichlet", local_test_fraction=0.25)
    local = split.local_test()
    assert local is not None and whole.local_test() is None
    assert np.array_equal(local.client_sizes, np.floor(0.25 * whole.client_sizes))
    assert np.array_equal(split.client_sizes + local.client_sizes, whole.client_sizes)
    assert split.num_train + local.num_train == whole.num_train
    assert pq.read_table(split.test_path).equals(pq.read_table(whole.test_path))
    rows, train, held = (_client_rows(f.train_path) for f in (whole, split, local))
    for c, mine in rows.items():
        both = np.concatenate([train[c], held.get(c, np.zeros((0, mine.shape[1])))])
        assert np.array_equal(np.unique(both, axis=0), mine)
        labels, got = (np.bincount(r[:, -1].astype(np.int64), minlength=10) for r in (mine, held.get(c, mine[:0])))
        assert np.all(np.abs(got - 0.25 * labels) < 1)
    again = FederatedData.from_dict(split.to_dict()).local_test()
    assert again is not None and np.array_equal(again.client_sizes, local.client_sizes)


def test_a_local_test_fraction_that_holds_out_nothing_is_a_data_error(tmp_path):
    from raysim.errors import DataError

    with pytest.raises(DataError, match=r"data.local_test_fraction: 0.005 holds out no sample of any client"):
        digits(tmp_path, local_test_fraction=0.005)


def test_read_clients_returns_exactly_those_rows_as_in_pandas(tmp_path):
    fd = digits(tmp_path, kind="dirichlet")
    got = read_clients(fd.train_path, np.array([7, 2, 7]))
    assert list(got) == [7, 2]
    df = pd.read_parquet(fd.train_path)
    for c, (x, y) in got.items():
        rows = df[df.client_id == c]
        assert x.shape == (fd.client_sizes[c], 64) and x.dtype == np.float32 and y.dtype == np.int64
        assert np.array_equal(x, np.stack(rows.x.to_numpy()).astype(np.float32))
        assert np.array_equal(y, rows.y.to_numpy())
        assert not x.flags.owndata and not x.flags.writeable  # a view of the Arrow buffer
    with pytest.raises(KeyError):
        read_clients(fd.train_path, [10])


@pytest.mark.parametrize("ids, shuffled, clients", [([7, 2, 7, 4], False, 10), (range(3, 9), False, 10),
                                                     (range(30, 47), False, 100), (range(3, 9), True, 10)],
                         ids=["scattered", "a-run", "a-run-of-small-clients", "rows-out-of-client-order"])
def test_a_client_block_holds_each_clients_rows_at_its_offsets_in_file_order(tmp_path, monkeypatch, ids, shuffled, clients):
    """The shard's one block of rows: client ids[i] at x[offsets[i]:offsets[i+1]], the rows read_clients gives
    it, across row groups (40 rows each), for a run of ids (of clients larger than a group, and of groups that
    hold several clients), scattered ids asked for out of order, and a file whose rows are not grouped by client.
    Only the groups at a run's ends need a first pass over client_id."""
    monkeypatch.setattr(federated, "ROW_GROUP_BYTES", 40 * (64 * 4 + 16))
    fd = digits(tmp_path, kind="dirichlet", num_clients=clients)
    if shuffled:
        table = pq.read_table(fd.train_path)
        pq.write_table(table.take(np.random.default_rng(0).permutation(len(table))), fd.train_path, row_group_size=40)
    first_pass, read = [], pq.ParquetFile.read_row_group

    def spy(self, i, columns=None, **kwargs):
        if columns == ["client_id"]:
            first_pass.append(i)
        return read(self, i, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    got, offsets, x, y = read_client_block(fd.train_path, ids)
    first_passes = len(first_pass)  # read_clients below reads client_id too
    want = sorted(read_clients(fd.train_path, ids).items())
    assert got.tolist() == sorted(set(ids)) and len(offsets) == len(got) + 1 and offsets[0] == 0
    assert offsets[-1] == len(x) == len(y) == sum(len(cy) for _, (cx, cy) in want)  # those rows and no others
    if isinstance(ids, range) and not shuffled:  # a run's inner groups are read whole, their client_id once
        assert first_passes <= 2 and len(x) > 3 * 40
    for i, (c, (cx, cy)) in enumerate(want):
        assert got[i] == c and np.array_equal(x[offsets[i]:offsets[i + 1]], cx) and np.array_equal(y[offsets[i]:offsets[i + 1]], cy)
    with pytest.raises(KeyError, match=rf"clients \[{clients}\]"):
        read_client_block(fd.train_path, [3, clients])


@pytest.mark.parametrize("rows", [[], [0], [5, 39, 40, 41, 700, 1437], list(range(1438))], ids=["none", "first", "spread", "all"])
def test_read_rows_reads_exactly_those_rows_across_row_groups(tmp_path, monkeypatch, rows):
    """The evaluation's training sample: rows at file positions, across row groups of 40 rows (and at their edges)."""
    monkeypatch.setattr(federated, "ROW_GROUP_BYTES", 40 * (64 * 4 + 16))
    fd = digits(tmp_path)
    full_x, full_y = read_table_arrays(fd.train_path)
    x, y = read_rows(fd.train_path, np.array(rows, dtype=np.int64))
    assert x.shape == (len(rows), 64) and x.dtype == full_x.dtype and y.dtype == full_y.dtype
    assert np.array_equal(x, full_x[rows]) and np.array_equal(y, full_y[rows])


def _bounds_by_rule(runs: np.ndarray, target: int) -> list[int]:
    """The row-group rule read client by client: a group starts at the first client starting in each window of
    `target` rows; a larger client starts groups every `target` of its rows, and the next client a new one."""
    bounds, windows, start = {int(np.sum(runs))}, set(), 0
    for m in runs.tolist():
        if start // target not in windows:
            windows.add(start // target)
            bounds.add(start)
        if m > target:
            bounds.update(range(start, start + m, target))
            bounds.add(start + m)
        start += m
    return sorted(bounds)


def test_row_group_bounds_follow_the_rule_without_a_pass_per_client_in_python():
    """The vectorized bounds (one array over the clients, at most: 10^8 of them in a build) are the rule's, for
    empty, small, large and mixed clients, and windows no client starts in."""
    rng = np.random.default_rng(3)
    cases = [np.zeros(0, np.int64), np.array([0, 0, 5]), np.array([7]), np.array([1, 1, 1, 30, 1])]
    cases += [rng.integers(0, 5, 60), rng.integers(1, 50, 80), rng.geometric(0.02, 50), rng.integers(0, 2, 90)] * 25
    for i, runs in enumerate(cases):
        target = [3, 1, 7, 10][i % 4] if i < 4 else int(rng.integers(1, 120))
        assert federated._row_group_bounds(runs, target) == _bounds_by_rule(runs, target), (runs, target)


def test_row_groups_keep_small_clients_whole_so_filters_prune(tmp_path, monkeypatch):
    monkeypatch.setattr(federated, "ROW_GROUP_BYTES", 40 * (64 * 4 + 16))  # 40 digits rows per group
    fd = digits(tmp_path, kind="quantity")
    meta = pq.ParquetFile(fd.train_path).metadata
    stats = [meta.row_group(i).column(0).statistics for i in range(meta.num_row_groups)]
    assert meta.num_row_groups >= 1438 // 40 and max(meta.row_group(i).num_rows for i in range(len(stats))) <= 80
    assert fd.client_sizes.min() <= 40 < fd.client_sizes.max()
    for c, size in enumerate(fd.client_sizes):
        groups = sum(s.min <= c <= s.max for s in stats)
        assert groups == 1 if size <= 40 else groups >= size // 40
    full_x, full_y = read_table_arrays(fd.train_path)
    got = read_clients(fd.train_path, range(10))
    for c, (x, y) in got.items():
        start = fd.client_sizes[:c].sum()
        assert np.array_equal(x, full_x[start:start + len(y)]) and np.array_equal(y, full_y[start:start + len(y)])


def test_natural_partition_of_synthetic_keeps_its_clients(tmp_path):
    cfg = DataConfig(source="synthetic", num_clients=15, synthetic_samples=2000,
                     partition={"kind": "natural", "min_size": 8})
    fd = build_federated(cfg, 0, tmp_path)
    assert fd.client_sizes.min() >= 8 and fd.num_train + fd.num_test == 2000
    x, y = read_table_arrays(fd.train_path)
    assert x.shape == (fd.num_train, 60) and len(read_clients(fd.train_path, range(15))) == 15


def test_parquet_natural_round_trip_through_build(tmp_path):
    gen = np.random.default_rng(1)
    n = 400
    df = pd.DataFrame({"client_id": gen.integers(100, 105, n), "label": gen.integers(0, 3, n)})
    df["feat"] = df.client_id.astype(float)  # the feature tells which client a row came from
    df["noise"] = gen.normal(size=n)
    path = tmp_path / "in.parquet"
    df.to_parquet(path)
    cfg = DataConfig(source="parquet", path=str(path), num_clients=5, partition={"kind": "natural"})
    fd = build_federated(cfg, 0, tmp_path / "out")
    for c, (x, _) in read_clients(fd.train_path, range(5)).items():
        assert np.all(x[:, 0] == 100 + c)
        assert len(x) >= 0.8 * np.sum(df.client_id == 100 + c)


def test_federated_data_dict_round_trip(tmp_path):
    fd = digits(tmp_path)
    d = fd.to_dict()
    assert json.loads(json.dumps(d)) == d
    back = FederatedData.from_dict(d)
    assert back.to_dict() == d and np.array_equal(back.client_sizes, fd.client_sizes)
    assert back.feature_shape == (64,) and back.image_shape == (1, 8, 8)


def test_too_many_clients_is_an_error_naming_num_clients(tmp_path):
    with pytest.raises(ValueError, match=r"data\.num_clients.*1438"):
        build_federated(DataConfig(source="digits", num_clients=1500), 0, tmp_path)
    with pytest.raises(ValueError, match=r"data\.num_clients.*min_size=200"):
        build_federated(DataConfig(source="digits", num_clients=10, partition={"min_size": 200}), 0, tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("target_shape", [(), (3,)])
def test_regression_source_round_trips_float64_exactly(tmp_path, target_shape):
    from raysim.data.sources import Source, register_source
    from raysim.plugins import SOURCES

    rng = np.random.default_rng(0)
    x = rng.standard_normal((60, 2, 2))
    y = rng.standard_normal((60, *target_shape))

    @register_source("regression_test")
    def regression_test(cfg, seed):
        return Source(x, y, (2, 2), 0)

    try:
        fed = build_federated(DataConfig(source="regression_test", num_clients=4), 0, tmp_path)
        assert fed.num_classes == 0 and fed.target_shape == target_shape
        assert FederatedData.from_dict(fed.to_dict()).target_shape == target_shape
        tx, ty = read_table_arrays(fed.test_path)
        parts = read_clients(fed.train_path, range(4))
        assert tx.dtype == np.float64 and ty.dtype == np.float64 and ty.shape[1:] == target_shape
        got_x = np.concatenate([tx, *(parts[c][0] for c in range(4))])
        got_y = np.concatenate([ty, *(parts[c][1] for c in range(4))])
        order = np.lexsort(got_x.reshape(60, -1).T)
        want = np.lexsort(x.reshape(60, -1).T)
        np.testing.assert_array_equal(got_x[order], x[want])  # bit-exact float64, nothing rounded to float32
        np.testing.assert_array_equal(got_y[order], y[want])
        with pytest.raises(ValueError, match="data.partition.kind: 'dirichlet'.*float targets"):
            build_federated(DataConfig(source="regression_test", num_clients=4, partition={"kind": "dirichlet"}),
                            0, tmp_path / "d")
    finally:
        SOURCES.pop("regression_test")


def test_a_natural_source_without_client_ids_is_a_data_error(tmp_path):
    """A source registered as natural must give each sample's client: else one DataError line, not a TypeError."""
    from raysim.data.sources import Source, register_source
    from raysim.errors import DataError
    from raysim.plugins import SOURCES

    @register_source("natural_without_ids", natural=True)
    def natural_without_ids(cfg, seed):
        return Source(np.zeros((40, 2)), np.zeros(40, dtype=np.int64), (2,), 2)

    try:
        with pytest.raises(DataError, match="'natural_without_ids' is registered as natural but gave no client ids"):
            build_federated(DataConfig(source="natural_without_ids", num_clients=4, partition={"kind": "natural"}),
                            0, tmp_path)
    finally:
        SOURCES.pop("natural_without_ids")


def _pooled(name: str):
    """A natural source registered whole that gives the block source `name`'s samples (the pooled build's path)."""
    from raysim.data.sources import load_source, register_source

    def whole(cfg, seed):
        return load_source(cfg.model_copy(update={"source": name}), seed)

    register_source(f"{name}-whole", natural=True)(whole)
    return f"{name}-whole"


@pytest.fixture
def own_sources():
    """The sources a test registers are gone after it."""
    from raysim.plugins import SOURCES

    saved = dict(SOURCES)
    yield
    SOURCES.clear()
    SOURCES.update(saved)


@pytest.fixture
def small_groups(monkeypatch):
    """Row groups of 40 synthetic rows and blocks of 50 samples: groups straddle blocks, blocks straddle groups."""
    from raysim.data import sources

    monkeypatch.setattr(federated, "ROW_GROUP_BYTES", 40 * (20 * 4 + 16))
    monkeypatch.setattr(sources, "SYNTHETIC_BLOCK_ROWS", 50)


def test_a_source_of_client_blocks_builds_the_pooled_builds_files_byte_for_byte(tmp_path, small_groups, own_sources):
    """Built a block of clients at a time, synthetic gives the very files (train, test, sizes; the local test split
    with seed 5) of the same samples built pooled: the same holdout per client and label, the same row order within
    a client, the same row groups."""
    whole = _pooled("synthetic")
    for seed, local in ((0, 0.0), (5, 0.3)):
        cfg = dict(num_clients=120, synthetic_samples=3000, partition={"kind": "natural", "min_size": 2},
                   local_test_fraction=local)
        blocks = build_federated(DataConfig(source="synthetic", **cfg), seed, tmp_path / f"blocks-{seed}")
        pooled = build_federated(DataConfig(source=whole, **cfg), seed, tmp_path / f"pooled-{seed}")
        assert pq.ParquetFile(blocks.train_path).metadata.num_row_groups > 3000 * 0.8 / 40 * (1 - local)
        names = ("local_test.parquet", "local_test_sizes.npy") if local else ()
        assert all((blocks.train_path.parent / name).exists() for name in names)
        for name in ("train.parquet", "test.parquet", "client_sizes.npy", *names):
            assert (blocks.train_path.parent / name).read_bytes() == (pooled.train_path.parent / name).read_bytes(), name
        assert (blocks.num_train, blocks.num_test) == (pooled.num_train, pooled.num_test)


def test_a_regression_source_of_client_blocks_matches_its_pooled_build(tmp_path, monkeypatch, own_sources):
    """A user's block source with float vector targets (num_classes 0): one stratum per client, the pooled files."""
    from raysim.data.sources import ClientBlocks, register_block_source

    monkeypatch.setattr(federated, "ROW_GROUP_BYTES", 30 * (3 * 8 + 2 * 8 + 8))

    @register_block_source("test-vector-blocks")
    def vector_blocks(cfg, seed):
        sizes = np.random.default_rng(seed).integers(3, 30, cfg.num_clients)
        first = np.concatenate([[0], np.cumsum(sizes)])
        gen = np.random.default_rng(seed + 1)
        data = gen.normal(size=(first[-1], 3)), gen.normal(size=(first[-1], 2))
        cuts = [0, 7, 8, 20, cfg.num_clients]
        return ClientBlocks(sizes, (3,), 0, ((a, b, data[0][first[a]:first[b]], data[1][first[a]:first[b]])
                                             for a, b in zip(cuts[:-1], cuts[1:])))

    whole = _pooled("test-vector-blocks")
    cfg = dict(num_clients=25, partition={"kind": "natural"}, test_fraction=0.3)
    blocks = build_federated(DataConfig(source="test-vector-blocks", **cfg), 2, tmp_path / "blocks")
    pooled = build_federated(DataConfig(source=whole, **cfg), 2, tmp_path / "pooled")
    for name in ("train.parquet", "test.parquet", "client_sizes.npy"):
        assert (tmp_path / "blocks" / name).read_bytes() == (tmp_path / "pooled" / name).read_bytes(), name
    assert blocks.target_shape == (2,) and blocks.num_classes == 0


def _traced_build_peak(cfg: DataConfig, out) -> int:
    """Peak traced bytes (tracemalloc) of building `cfg` into `out`."""
    tracemalloc.start()
    try:
        build_federated(cfg, 0, out)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_block_build_never_holds_the_pooled_samples(tmp_path, monkeypatch, own_sources):
    """Peak traced memory of the block build (blocks of 4096 samples) is under a third of the pooled build's,
    whose features alone are 48 MB."""
    from raysim.data import sources

    monkeypatch.setattr(federated, "WRITE_AHEAD", 2)
    monkeypatch.setattr(sources, "SYNTHETIC_BLOCK_ROWS", 4096)
    whole = _pooled("synthetic")
    cfg = dict(num_clients=20_000, synthetic_samples=600_000, synthetic_features=20, partition={"kind": "natural"})
    peaks = {source: _traced_build_peak(DataConfig(source=source, **cfg), tmp_path / source)
             for source in ("synthetic", whole)}
    assert peaks["synthetic"] < peaks[whole] / 3, peaks
    assert (tmp_path / "synthetic" / "train.parquet").read_bytes() == (tmp_path / whole / "train.parquet").read_bytes()


def test_a_block_builds_memory_grows_by_a_few_arrays_over_its_clients_and_samples(tmp_path, monkeypatch):
    """What 10^8 clients need: traced memory grows, a client of 3 samples, by its sizes (before and after the
    holdout, 8 bytes each) and its samples' places in the two keyed permutations (4 bytes a sample each): about 40
    bytes, where the build held 122 before it kept no further array over every client. Small row groups and blocks
    keep the part that does not grow out of the difference."""
    from raysim.data import sources

    monkeypatch.setattr(federated, "ROW_GROUP_BYTES", 1 << 16)
    monkeypatch.setattr(federated, "WRITE_AHEAD", 1)
    monkeypatch.setattr(sources, "SYNTHETIC_BLOCK_ROWS", 4096)
    peaks = {}
    for n in (1_000, 50_000, 150_000):  # the first builds what a first build imports
        cfg = DataConfig(source="synthetic", num_clients=n, synthetic_samples=3 * n, synthetic_features=4,
                         partition={"kind": "natural"})
        peaks[n] = _traced_build_peak(cfg, tmp_path / str(n))
    per_client = (peaks[150_000] - peaks[50_000]) / 100_000
    assert per_client < 90, per_client


def test_a_block_that_disagrees_with_its_sizes_or_labels_is_refused(tmp_path, own_sources):
    """Each block is checked as a source: its sample count against `sizes`, its labels against num_classes, its
    first client against the last block's end, and no partial file is left behind."""
    from raysim.data.sources import ClientBlocks, register_block_source

    @register_block_source("test-bad-blocks")
    def bad_blocks(cfg, seed):
        labels = np.zeros(8, np.int64) if cfg.num_clients == 4 else np.full(8, 7, np.int64)
        if cfg.num_clients == 6:  # the clients 2..3 skipped
            return ClientBlocks(np.full(6, 4), (2,), 3, [(0, 2, np.zeros((8, 2), np.float32), np.zeros(8, np.int64)),
                                                         (4, 6, np.zeros((8, 2), np.float32), np.zeros(8, np.int64))])
        return ClientBlocks(np.full(cfg.num_clients, 4), (2,), 3,
                            [(0, 2, np.zeros((8, 2), np.float32), labels), (2, cfg.num_clients, np.zeros((3, 2), np.float32), np.zeros(3, np.int64))])

    with pytest.raises(ValueError, match=r"clients 2\.\.3 has 3 samples of float32/int64; its sizes say 8"):
        build_federated(DataConfig(source="test-bad-blocks", num_clients=4, partition={"kind": "natural"},
                                   test_fraction=0.25), 0, tmp_path / "a")
    with pytest.raises(ValueError, match=r"int64 labels in \[0, 3\)"):
        build_federated(DataConfig(source="test-bad-blocks", num_clients=5, partition={"kind": "natural"},
                                   test_fraction=0.25), 0, tmp_path / "b")
    with pytest.raises(ValueError, match=r"a block of clients starts at 4, not at 2"):
        build_federated(DataConfig(source="test-bad-blocks", num_clients=6, partition={"kind": "natural"},
                                   test_fraction=0.25), 0, tmp_path / "c")
    assert not any(list((tmp_path / d).iterdir()) for d in "abc")

