"""The dataset file loaders on small files written in each on-disk format, with their official test
splits (FedFisher, algorithms/fedfisher/README.md)."""
import gzip
import pickle

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.io import savemat

from raysim.data import DataConfig, build_federated, check_source, load_source
from raysim.errors import DataError


def cfg(source, path):
    return DataConfig(source=source, path=str(path), num_clients=2)


def idx_bytes(arr):
    header = bytes([0, 0, 0x08, arr.ndim]) + np.asarray(arr.shape, dtype=">i4").tobytes()
    return header + arr.astype(np.uint8).tobytes()


def fashion_mnist_files(root, gzip_images):
    """Six train and four t10k images with labels as IDX files under root/FashionMNIST/raw."""
    rng = np.random.default_rng(0)
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    images = {"train": rng.integers(0, 256, (6, 28, 28)), "t10k": rng.integers(0, 256, (4, 28, 28))}
    labels = {"train": np.array([0, 1, 2, 3, 4, 9]), "t10k": np.array([5, 6, 7, 8])}
    for split in ("train", "t10k"):
        name = f"{split}-images-idx3-ubyte"
        if gzip_images:
            (raw / f"{name}.gz").write_bytes(gzip.compress(idx_bytes(images[split])))
        else:
            (raw / name).write_bytes(idx_bytes(images[split]))
        (raw / f"{split}-labels-idx1-ubyte").write_bytes(idx_bytes(labels[split]))
    return images, labels


def test_fashion_mnist_idx_files(tmp_path):
    images, labels = fashion_mnist_files(tmp_path, gzip_images=True)
    src = load_source(cfg("fashion_mnist", tmp_path), 0)
    assert src.x.shape == (10, 784) and src.image_shape == (1, 28, 28)
    np.testing.assert_array_equal(src.y, np.concatenate([labels["train"], labels["t10k"]]))
    np.testing.assert_allclose(src.x[7], (images["t10k"][1].reshape(-1) / 255.0 - 0.1307) / 0.3081, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(src.test_mask, [False] * 6 + [True] * 4)


def test_cifar10_pickles(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(1)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batches[name] = {b"data": rng.integers(0, 256, (2, 3072)).astype(np.uint8), b"labels": [1, 7]}
        (folder / name).write_bytes(pickle.dumps(batches[name]))
    src = load_source(cfg("cifar10", tmp_path), 0)
    assert src.x.shape == (12, 3072) and src.image_shape == (3, 32, 32)
    first = batches["data_batch_1"][b"data"][0].reshape(3, 32, 32)
    green = (first[1] / 255.0 - 0.482) / 0.243  # channel-first, channel 1
    np.testing.assert_allclose(src.x[0].reshape(3, 32, 32)[1], green, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(src.test_mask, [False] * 10 + [True] * 2)


def test_svhn_mat_files_map_label_10_to_0(tmp_path):
    rng = np.random.default_rng(2)
    for name, n in (("train_32x32.mat", 3), ("test_32x32.mat", 2)):
        savemat(tmp_path / name, {"X": rng.integers(0, 256, (32, 32, 3, n)).astype(np.uint8),
                                  "y": np.array([[10], [3], [1]][:n])})
    src = load_source(cfg("svhn", tmp_path), 0)
    np.testing.assert_array_equal(src.y, [0, 3, 1, 0, 3])
    assert src.x.shape == (5, 3072) and src.x.min() >= 0 and src.x.max() <= 1
    np.testing.assert_array_equal(src.test_mask, [False] * 3 + [True] * 2)


def test_cinic10_png_folders(tmp_path):
    for split, classes in (("train", ("airplane", "truck")), ("test", ("cat",))):
        for c in classes:
            (tmp_path / split / c).mkdir(parents=True)
            Image.fromarray(np.full((32, 32, 3), 200, dtype=np.uint8)).save(tmp_path / split / c / "a.png")
    src = load_source(cfg("cinic10", tmp_path), 0)
    np.testing.assert_array_equal(src.y, [0, 9, 3])
    np.testing.assert_array_equal(src.test_mask, [False, False, True])
    np.testing.assert_allclose(src.x[0].reshape(3, 32, 32)[0, 0, 0], (200 / 255 - 0.4789) / 0.2421, rtol=1e-5, atol=1e-6)


def test_missing_files_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="data.path"):
        load_source(cfg("cifar10", tmp_path), 0)


@pytest.mark.parametrize("name", ["fashion_mnist", "cifar10", "svhn", "cinic10"])
def test_the_quick_check_needs_the_directory(tmp_path, name):
    with pytest.raises(DataError, match=f"data.path: .* is not a directory \\(source '{name}'\\)"):
        check_source(cfg(name, tmp_path / "missing"))
    check_source(cfg(name, tmp_path))


def test_digits28_shape():
    src = load_source(DataConfig(source="digits28", num_clients=2), 0)
    assert src.x.shape == (1797, 784) and src.image_shape == (1, 28, 28)
    assert 0 <= src.x.min() and src.x.max() <= 1


def test_official_test_split_is_the_servers_test_set(tmp_path):
    """`data.test_split: source`: the server tests on exactly the source's test files, clients share the rest."""
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        labels = [9, 9, 9] if name == "test_batch" else [i, i, i]
        (folder / name).write_bytes(pickle.dumps({b"data": rng.integers(0, 256, (3, 3072)).astype(np.uint8),
                                                  b"labels": labels}))
    data = DataConfig(source="cifar10", path=str(tmp_path), num_clients=3, test_split="source")
    fed = build_federated(data, 0, tmp_path / "fed")
    assert (fed.num_train, fed.num_test) == (15, 3)
    test_y = pd.read_parquet(fed.test_path)["y"]
    assert (test_y == 9).all() and (pd.read_parquet(fed.train_path)["y"] != 9).all()


def test_official_test_split_needs_a_source_that_has_one(tmp_path):
    with pytest.raises(ValueError, match="data.test_split.*'digits'"):
        build_federated(DataConfig(source="digits", num_clients=2, test_split="source"), 0, tmp_path)
