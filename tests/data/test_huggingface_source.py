"""`source: huggingface` on tiny datasets the tests build and save with `save_to_disk` (no download)."""
import sys

import datasets
import numpy as np
import pytest
from PIL import Image

from raysim.config import load_config
from raysim.data import DataConfig, build_federated, check_source, load_source
from raysim.errors import DataError


def hf(path, **options):
    return DataConfig(source="huggingface", num_clients=2, options={"path": str(path), **options})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A DatasetDict of RGB images (an Image feature), a 2x3 array and a ClassLabel, train 6 rows and test 4."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (10, 4, 5, 3), dtype=np.uint8)
    grids = rng.normal(size=(10, 2, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
    features = datasets.Features({"image": datasets.Image(), "grid": datasets.Array2D((2, 3), "float32"),
                                  "label": datasets.ClassLabel(names=["a", "b", "c", "d"])})

    def part(rows):
        return datasets.Dataset.from_dict({"image": [Image.fromarray(pixels[i]) for i in rows],
                                           "grid": grids[rows].tolist(), "label": labels[rows].tolist()}, features)

    path = tmp_path_factory.mktemp("hf") / "saved"
    datasets.DatasetDict({"train": part(range(6)), "test": part(range(6, 10))}).save_to_disk(str(path))
    return path, pixels, grids, labels


def test_saved_dataset_dict_gives_images_and_its_test_split(saved, tmp_path):
    path, pixels, grids, labels = saved
    src = load_source(hf(path, features=["image"]), 0)
    assert src.image_shape == (3, 4, 5) and src.num_classes == 4  # the ClassLabel's 4 names, though d never occurs
    np.testing.assert_array_equal(src.x.reshape(10, 3, 4, 5), pixels.transpose(0, 3, 1, 2) / np.float32(255))
    np.testing.assert_array_equal(src.y, labels)
    np.testing.assert_array_equal(src.test_mask, [False] * 6 + [True] * 4)
    grid = load_source(hf(path, features=["grid"]), 0)
    assert grid.image_shape == (1, 2, 3) and np.array_equal(grid.x, grids.reshape(10, -1))
    both = load_source(hf(path), 0)  # every feature column: flat, no image shape
    assert both.x.shape == (10, 66) and both.image_shape is None
    shaped = load_source(hf(path, features=["grid"]).model_copy(update={"feature_shape": [6, 1]}), 0)
    assert shaped.image_shape == (6, 1)
    fed = build_federated(hf(path, features=["image"]).model_copy(update={"test_split": "source"}), 0, tmp_path)
    assert (fed.num_train, fed.num_test, fed.image_shape) == (6, 4, (3, 4, 5))


def test_one_saved_dataset_and_the_errors(saved, tmp_path, monkeypatch):
    path, pixels, grids, labels = saved
    single = tmp_path / "single"
    datasets.load_from_disk(str(path))["test"].save_to_disk(str(single))
    src = load_source(hf(single, features=["grid"]), 0)
    assert src.test_mask is None and np.array_equal(src.x, grids[6:].reshape(4, -1))
    with pytest.raises(DataError, match="data.options: .*single holds one Dataset without splits, so split: 'train'"):
        load_source(hf(single, split="train"), 0)
    with pytest.raises(DataError, match=r"data.options.split: .* has no split 'valid' \(splits: \['train', 'test'\]\)"):
        load_source(hf(path, split="valid"), 0)
    with pytest.raises(DataError, match=r"data.options.label: no column 'y' in .* \(columns: \['image', 'grid', 'label'\]\)"):
        load_source(hf(path, label="y"), 0)
    with pytest.raises(DataError, match=r"data.options.features: \['pixels'\] are not feature columns"):
        load_source(hf(path, features=["pixels"]), 0)
    with pytest.raises(DataError, match="data.options.path: '.*nowhere' is not a directory"):
        load_source(hf(tmp_path / "nowhere"), 0)
    with pytest.raises(DataError, match="data.options.path: .* is not a dataset saved with save_to_disk"):
        load_source(hf(tmp_path), 0)
    with pytest.raises(DataError, match=r"data.feature_shape: \[4\] needs 4 values per sample"):
        load_source(hf(path, features=["grid"]).model_copy(update={"feature_shape": [4]}), 0)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if the extra were not installed
    with pytest.raises(DataError, match=r"pip install 'raysim-fl\[huggingface\]'"):
        load_source(hf(path), 0)


def test_the_quick_check_needs_the_saved_directory(saved, tmp_path):
    with pytest.raises(DataError, match="data.options.path: .* is not a directory"):
        check_source(hf(tmp_path / "missing"))
    check_source(hf(saved[0]))


def test_a_writer_column_gives_the_natural_clients(tmp_path):
    """`partition: natural` with `data.client_column`: FEMNIST-style writer ids, numbered in sorted order, over both
    splits; the writer column is no feature; one missing is one line."""
    writers = ["w3", "w1", "w2", "w1", "w3", "w2", "w1", "w2"]
    data = datasets.Dataset.from_dict({"x": np.arange(8, dtype=np.float32).tolist(), "writer": writers,
                                       "label": [0, 1, 0, 1, 0, 1, 0, 1]})
    path = tmp_path / "writers"
    datasets.DatasetDict({"train": data.select(range(6)), "test": data.select(range(6, 8))}).save_to_disk(str(path))
    cfg = DataConfig(source="huggingface", num_clients=3, client_column="writer", partition={"kind": "natural"},
                     options={"path": str(path)})
    src = load_source(cfg, seed=0)
    assert src.feature_shape == (1,) and src.description["client_column"] == "writer"
    np.testing.assert_array_equal(src.natural_clients, [2, 0, 1, 0, 2, 1, 0, 1])
    fed = build_federated(cfg, 0, tmp_path / "fed")
    assert fed.num_clients == 3 and fed.num_train + fed.num_test == 8
    counted = load_config({"data": {"source": "huggingface", "client_column": "writer", "partition": {"kind": "natural"},
                                    "options": {"path": str(path)}}, "algorithm": {"clients_per_round": 2}})
    assert counted.data.num_clients == 3  # data.num_clients left out: the writers counted
    with pytest.raises(DataError, match="data.client_column: no column 'user'"):
        load_source(cfg.model_copy(update={"client_column": "user"}), seed=0)
