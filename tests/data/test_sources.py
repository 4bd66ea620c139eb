"""Sources: shapes, ranges, determinism, offline generation, Synthetic(alpha, beta) heterogeneity, parquet
(flat, array and image columns; a CNN trained on Parquet images)."""
from __future__ import annotations

import io
import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError

import raysim
from raysim.cli import main
from raysim.data import DataConfig, Source, check_source, load_source, register_source
from raysim.config import ConfigError, dump_config, load_config
from raysim.errors import DataError
from raysim.plugins import SOURCES

ROOT = Path(__file__).resolve().parents[2]


def test_digits_is_the_bundled_8x8_set_in_unit_range():
    src = load_source(DataConfig(source="digits", num_clients=1), seed=0)
    assert src.x.shape == (1797, 64) and src.x.dtype == np.float32
    assert src.x.min() == 0.0 and src.x.max() == 1.0
    assert src.y.dtype == np.int64 and set(np.unique(src.y)) == set(range(10))
    assert src.feature_shape == (64,) and src.image_shape == (1, 8, 8) and src.num_classes == 10
    assert src.natural_clients is None


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a data source tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_mnist1d_generates_offline_deterministically(no_network, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the package's cached path would write ./mnist1d_data.pkl
    np.random.seed(123)
    random.seed(123)
    before = np.random.random(), random.random()
    np.random.seed(123)
    random.seed(123)
    cfg = DataConfig(source="mnist1d", num_clients=1, mnist1d_samples=500)
    a = load_source(cfg, seed=0)
    assert (np.random.random(), random.random()) == before  # global RNGs untouched
    assert a.x.shape == (500, 40) and a.x.dtype == np.float32 and a.image_shape == (1, 40)
    assert a.num_classes == 10 and np.array_equal(np.bincount(a.y), np.full(10, 50))
    assert np.array_equal(a.x, load_source(cfg, seed=0).x)
    assert not np.array_equal(a.x, load_source(cfg, seed=1).x)
    assert list(tmp_path.iterdir()) == []


def synthetic_heterogeneity(alpha: float, beta: float) -> tuple[float, float]:
    """(mean per-client label entropy, spread of the per-client feature means), averaged over 3 seeds."""
    out = []
    for seed in range(3):
        cfg = DataConfig(source="synthetic", num_clients=100, synthetic_samples=20000,
                         synthetic_alpha=alpha, synthetic_beta=beta)
        src = load_source(cfg, seed)
        entropy, means = [], []
        for k in range(100):
            mine = src.natural_clients == k
            p = np.bincount(src.y[mine], minlength=10) / mine.sum()
            entropy.append(-np.sum(p[p > 0] * np.log(p[p > 0])))
            means.append(src.x[mine].mean())
        out.append((np.mean(entropy), np.std(means)))
    return tuple(np.mean(out, axis=0))


def test_synthetic_shapes_and_natural_clients():
    cfg = DataConfig(source="synthetic", num_clients=20, synthetic_samples=3000, synthetic_features=12,
                     synthetic_classes=5, partition={"kind": "natural", "min_size": 4})
    src = load_source(cfg, seed=0)
    assert src.x.shape == (3000, 12) and src.x.dtype == np.float32 and src.num_classes == 5
    sizes = np.bincount(src.natural_clients, minlength=20)
    assert len(sizes) == 20 and sizes.sum() == 3000 and sizes.min() >= 5  # ceil(4 / 0.8)
    assert sizes.max() > 3 * np.median(sizes)  # lognormal client sizes
    assert np.array_equal(src.x, load_source(cfg, seed=0).x)


def test_synthetic_draws_each_client_in_turn_whatever_the_block(monkeypatch):
    """The blocked generator gives the numbers of the per-client loop of the definition (W_k, b_k, then x_k from one
    stream), with blocks of one client, of a few, and of all."""
    from raysim.data import sources
    from raysim.data.partition import apportion
    from raysim.core.rng import SERVER, SETUP, stream

    cfg = DataConfig(source="synthetic", num_clients=40, synthetic_samples=3000, synthetic_features=7,
                     synthetic_classes=4, synthetic_alpha=1.0, synthetic_beta=1.0, partition={"kind": "natural"})
    rng = stream(3, SETUP, SERVER, "synthetic")
    sizes = apportion(3000, rng.lognormal(4.0, 2.0, 40) + 50.0, 2)  # min_size 1 kept after a 0.2 holdout
    u, v = rng.normal(0.0, 1.0, (40, 4)), rng.normal(rng.normal(0.0, 1.0, (40, 1)), 1.0, (40, 7))
    xs, ys = [], []
    for k in range(40):
        w, b = rng.normal(u[k], 1.0, (7, 4)), rng.normal(u[k], 1.0, 4)
        xs.append(v[k] + rng.standard_normal((sizes[k], 7)) * np.arange(1, 8) ** -0.6)
        ys.append(np.argmax(xs[-1] @ w + b, axis=1))
    for rows in (1, 200, 10**6):
        monkeypatch.setattr(sources, "SYNTHETIC_BLOCK_ROWS", rows)
        src = load_source(cfg, 3)
        assert np.array_equal(src.x, np.concatenate(xs).astype(np.float32)) and np.array_equal(src.y, np.concatenate(ys))
        assert np.array_equal(src.natural_clients, np.repeat(np.arange(40), sizes))


def test_synthetic_alpha_and_beta_increase_heterogeneity():
    """Synthetic(0, 0) is already label-skewed (independent W_k); alpha skews each client's class
    priors further, beta moves each client's features apart and skews labels strongly."""
    entropy, spread = synthetic_heterogeneity(0.0, 0.0)
    entropy_alpha, spread_alpha = synthetic_heterogeneity(10.0, 0.0)
    entropy_beta, spread_beta = synthetic_heterogeneity(0.0, 10.0)
    assert entropy_alpha < entropy - 0.05 and spread_alpha == pytest.approx(spread)
    assert entropy_beta < entropy - 0.2 and spread_beta > 10 * spread


def test_parquet_round_trip_keeps_the_natural_clients(tmp_path):
    gen = np.random.default_rng(0)
    n = 300
    df = pd.DataFrame({
        "user": gen.choice(["carol", "alice", "bob"], n),
        "f0": gen.normal(size=n),
        "f1": gen.integers(0, 5, n),
        "note": ["text"] * n,  # not numeric: not a feature
        "target": gen.choice(["cat", "dog"], n),
    })
    df["emb"] = list(gen.normal(size=(n, 3)))
    path = tmp_path / "users.parquet"
    df.to_parquet(path)
    cfg = DataConfig(source="parquet", path=str(path), num_clients=3, client_column="user",
                     label_column="target", partition={"kind": "natural"})
    src = load_source(cfg, seed=0)
    expected = np.column_stack([df.f0, df.f1, np.stack(df.emb)]).astype(np.float32)
    assert src.feature_shape == (5,) and np.array_equal(src.x, expected)
    assert src.num_classes == 2 and np.array_equal(src.y, (df.target == "dog").to_numpy())
    names = np.array(["alice", "bob", "carol"])
    assert np.array_equal(names[src.natural_clients], df.user.to_numpy())

    subset = load_source(cfg.model_copy(update={"feature_columns": ["f1"]}), seed=0)
    assert np.array_equal(subset.x[:, 0], df.f1.to_numpy())
    assert src.description["classes"] == ["cat", "dog"] and src.description["feature_columns"] == ["f0", "f1", "emb"]
    assert (src.description["label_column"], src.description["client_column"]) == ("target", "user")


def test_a_runs_data_description_records_the_columns_and_the_labels(tmp_path, capsys):
    """The label mapping (string labels numbered in sorted order) and the feature columns chosen are in the run's
    data/federated.json and, with -v, on stderr."""
    gen = np.random.default_rng(1)
    n = 120
    df = pd.DataFrame({"a": gen.normal(size=n), "b": gen.normal(size=n), "label": gen.choice(["zebra", "ant", "mole"], n)})
    df.to_parquet(tmp_path / "animals.parquet")
    config = tmp_path / "animals.yaml"
    config.write_text(yaml.safe_dump({
        "name": "animals", "backend": "local", "model": {"name": "logreg"},
        "data": {"source": "parquet", "path": str(tmp_path / "animals.parquet"), "num_clients": 4},
        "algorithm": {"name": "fedavg", "rounds": 1, "clients_per_round": 2, "local_steps": 1}}))
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "-v"]) == 0
    described = json.loads((out / "data" / "federated.json").read_text())["description"]
    assert described["classes"] == ["ant", "mole", "zebra"] and described["feature_columns"] == ["a", "b"]
    assert "data: classes ['ant', 'mole', 'zebra']" in capsys.readouterr().err


def test_parquet_errors_name_the_column(tmp_path):
    path = tmp_path / "plain.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "label": [0, 1]}).to_parquet(path)
    with pytest.raises(ValueError, match="data.client_column"):
        load_source(DataConfig(source="parquet", path=str(path), num_clients=1, partition={"kind": "natural"}), 0)
    with pytest.raises(ValueError, match="data.label_column"):
        load_source(DataConfig(source="parquet", path=str(path), num_clients=1, label_column="y"), 0)
    with pytest.raises(ValueError, match="data.feature_columns"):
        load_source(DataConfig(source="parquet", path=str(path), num_clients=1, feature_columns=["b"]), 0)


def test_the_quick_check_finds_what_the_build_would_without_reading_a_row(tmp_path, monkeypatch):
    """check_source (made before Ray starts) gives the build's own errors for a missing file or column,
    from the Parquet schema alone; a source registered without a check passes it."""
    path = tmp_path / "plain.parquet"
    pd.DataFrame({"a": [1.0, 2.0], "label": [0, 1]}).to_parquet(path)
    monkeypatch.setattr(pq, "read_table", None)  # a row read would fail with a TypeError
    bad = [({"path": str(tmp_path / "missing.parquet")}, "data.path: .* is not a file"),
           ({"path": str(path), "label_column": "y"}, "data.label_column: no column 'y'"),
           ({"path": str(path), "feature_columns": ["b"]}, "data.feature_columns: no columns \\['b'\\]"),
           ({"path": str(path), "partition": {"kind": "natural"}}, "data.client_column")]
    for fields, message in bad:
        with pytest.raises(DataError, match=message):
            check_source(DataConfig(source="parquet", num_clients=1, **fields))
    check_source(DataConfig(source="parquet", path=str(path), num_clients=1))
    check_source(DataConfig(source="digits", num_clients=1))


def test_a_missing_file_stops_a_run_before_ray_starts(tmp_path):
    code = ("import raysim.runner.ray_session as rs, raysim\n"
            "starts = []\n"
            "rs.start_local = lambda *a, **k: starts.append(1)\n"
            "try:\n"
            f"    raysim.run('configs/fedavg/quickstart.yaml', ['data.source=parquet', 'data.path={tmp_path}/none.parquet'],"
            f" out='{tmp_path}/run')\n"
            "except raysim.errors.DataError as e:\n"
            "    print(len(starts), e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.stdout.startswith("0 data.path: ") and "none.parquet" in proc.stdout, proc.stderr
    assert not (tmp_path / "run").exists()


def test_registered_source_and_its_shape_checks():
    @register_source("tiny")
    def tiny(cfg, seed):
        return Source(np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]), (2,), 2)

    try:
        assert load_source(DataConfig(source="tiny", num_clients=2), 0).x.shape == (4, 2)
    finally:
        SOURCES.pop("tiny")
    with pytest.raises(ValueError, match="float32 or float64"):
        Source(np.zeros((4, 2), np.int64), np.zeros(4, np.int64), (2,), 2)
    with pytest.raises(ValueError, match="regression"):
        Source(np.zeros((2, 2)), np.array([0.0, np.nan]), (2,), 0)
    with pytest.raises(ValueError, match="int64 labels"):
        Source(np.zeros((2, 2)), np.array([0.5, 1.0]), (2,), 2)


def test_mnist1d_seed_option_and_the_packages_own_test_split(no_network, tmp_path):
    """options.seed fixes the generator (42: the package's default set) for every experiment seed;
    test_split: source holds out the package's own test set, the last 20% of its samples."""
    from mnist1d.data import get_dataset_args, make_dataset
    from mnist1d.utils import ObjectView

    from raysim.data.federated import build_federated

    cfg = DataConfig(source="mnist1d", num_clients=2, mnist1d_samples=500, options={"seed": 42}, test_split="source")
    src = load_source(cfg, seed=0)
    args = get_dataset_args(as_dict=True)
    del args["url"]
    args["num_samples"] = 500
    ref = make_dataset(ObjectView(args))
    assert np.array_equal(src.x, np.concatenate([ref["x"], ref["x_test"]]).astype(np.float32))
    assert np.array_equal(src.test_mask, np.arange(500) >= 400)
    assert np.array_equal(load_source(cfg, seed=5).x, src.x)
    fed = build_federated(cfg, 1, tmp_path)
    assert (fed.num_train, fed.num_test) == (400, 100)
    with pytest.raises(ValueError, match="data.options"):
        DataConfig(source="mnist1d", num_clients=1, options={"sead": 42})


def bar_images(n: int, scramble: bool, size: int = 10, seed: int = 0) -> pd.DataFrame:
    """PNG images of one bar, vertical (label 0) or horizontal (label 1), at a random place in a random
    colour, so only the layout of the pixels tells the classes apart; `scramble` shuffles each image's pixels."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    blobs = []
    for label in labels:
        pixels = np.zeros((size, size, 3), np.uint8)
        at, start = rng.integers(0, size), rng.integers(0, size - 5)
        bar = (slice(start, start + 5), at) if label == 0 else (at, slice(start, start + 5))
        pixels[bar] = rng.integers(100, 256, 3)
        if scramble:
            pixels = pixels.reshape(-1, 3)[rng.permutation(size * size)].reshape(size, size, 3)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        blobs.append(buf.getvalue())
    return pd.DataFrame({"id": np.arange(n), "image": blobs, "label": labels})


def test_parquet_images_train_a_cnn(tmp_path):
    """A CNN learns bar orientation from a Parquet image column; with each image's pixels shuffled it cannot."""
    accuracy = {}
    for scramble in (False, True):
        path = tmp_path / f"bars{scramble}.parquet"
        bar_images(400, scramble).to_parquet(path)
        cfg = {"name": "bars", "seed": 0,
               "data": {"source": "parquet", "path": str(path), "num_clients": 4, "feature_columns": ["image"]},
               "model": {"name": "cnn", "channels": [8, 8]},
               "algorithm": {"name": "fedavg", "rounds": 12, "clients_per_round": 4, "lr": 1.0, "local_steps": 10,
                             "batch_size": 16}}
        result = raysim.run(cfg, out=tmp_path / f"run{scramble}", backend="local")
        accuracy[scramble] = result.rounds["test_accuracy"].iloc[-1]
    assert accuracy[False] > 0.85 and accuracy[True] < 0.7


def test_parquet_feature_shape_reshapes_a_flat_column(tmp_path):
    x = np.random.default_rng(0).normal(size=(6, 12)).astype(np.float32)
    path = tmp_path / "flat.parquet"
    pd.DataFrame({"pixels": list(x), "label": [0, 1] * 3}).to_parquet(path)
    src = load_source(DataConfig(source="parquet", path=str(path), num_clients=2, feature_shape=[3, 2, 2]), 0)
    assert src.image_shape == (3, 2, 2) and src.feature_shape == (12,) and np.array_equal(src.x, x)
    with pytest.raises(DataError, match=rf"data.feature_shape: \[1, 3, 3\] needs 9 values per sample, but the "
                                        rf"columns of {path} give 12 \(shape per sample: 'pixels' \(12,\)\)"):
        load_source(DataConfig(source="parquet", path=str(path), num_clients=2, feature_shape=[1, 3, 3]), 0)
    with pytest.raises(ValidationError, match="data.feature_shape applies to sources"):
        DataConfig(source="digits", num_clients=2, feature_shape=[1, 8, 8])


def test_the_natural_partition_counts_its_clients_when_num_clients_is_left_out(tmp_path):
    """Parquet's client column gives data.num_clients under partition natural; elsewhere leaving it out is one line."""
    df = pd.DataFrame({"f": np.arange(40.0), "label": np.arange(40) % 3, "user": np.repeat(["u1", "u2", "u3", "u4"], 10)})
    df.to_parquet(tmp_path / "users.parquet")
    data = {"source": "parquet", "path": str(tmp_path / "users.parquet"), "client_column": "user",
            "partition": {"kind": "natural"}}
    cfg = load_config({"data": data, "model": {"name": "logreg"}, "algorithm": {"clients_per_round": 2}})
    assert cfg.data.num_clients == 4 and "num_clients: 4" in dump_config(cfg)
    with pytest.raises(ConfigError, match="data.num_clients: give the number of clients"):
        load_config({"data": {"source": "digits"}})
    with pytest.raises(DataError, match="data.client_column: no column 'writer'"):
        load_config({"data": {**data, "client_column": "writer"}})
