"""`source: torchvision` on tiny datasets the tests write in the classes' own on-disk formats (no download)."""
import sys

import numpy as np
import pytest
from PIL import Image

from raysim.data import DataConfig, build_federated, load_source
from raysim.errors import DataError

from .test_vision import fashion_mnist_files


def tv(root, name="FashionMNIST", **options):
    return DataConfig(source="torchvision", num_clients=2, options={"name": name, "root": str(root), **options})


def test_fashion_mnist_idx_files_read_by_torchvision(tmp_path):
    """torchvision's FashionMNIST class on its raw IDX files gives the pixels that raysim's own reader gives."""
    images, labels = fashion_mnist_files(tmp_path, gzip_images=False)  # torchvision reads them uncompressed
    src = load_source(tv(tmp_path), 0)
    assert src.image_shape == (1, 28, 28) and src.feature_shape == (784,) and src.num_classes == 10
    pixels = np.concatenate([images["train"], images["t10k"]]).reshape(10, -1).astype(np.float32) / 255
    np.testing.assert_array_equal(src.x, pixels)
    np.testing.assert_array_equal(src.y, np.concatenate([labels["train"], labels["t10k"]]))
    np.testing.assert_array_equal(src.test_mask, [False] * 6 + [True] * 4)
    own = load_source(DataConfig(source="fashion_mnist", path=str(tmp_path), num_clients=2), 0)
    np.testing.assert_allclose(own.x * 0.3081 + 0.1307, src.x, atol=1e-6)  # raysim's reader normalizes
    fed = build_federated(tv(tmp_path).model_copy(update={"test_split": "source"}), 0, tmp_path / "fed")
    assert (fed.num_train, fed.num_test, fed.image_shape) == (6, 4, (1, 28, 28))


def test_image_folder_is_one_split_of_rgb_images(tmp_path):
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, (4, 5, 7, 3), dtype=np.uint8)
    for i, cls in enumerate(["cat", "cat", "dog", "dog"]):
        (tmp_path / cls).mkdir(exist_ok=True)
        Image.fromarray(pixels[i]).save(tmp_path / cls / f"{i}.png")
    src = load_source(tv(tmp_path, "ImageFolder"), 0)
    assert src.image_shape == (3, 5, 7) and src.num_classes == 2 and src.test_mask is None
    np.testing.assert_array_equal(src.x.reshape(4, 3, 5, 7), pixels.transpose(0, 3, 1, 2) / np.float32(255))
    np.testing.assert_array_equal(src.y, [0, 0, 1, 1])


def test_errors_name_the_option_and_what_is_allowed(tmp_path, monkeypatch):
    with pytest.raises(DataError, match=r"data.options.name: torchvision .* has no dataset 'Fashion' \(datasets: .*"
                                        r"FashionMNIST"):
        load_source(tv(tmp_path, "Fashion"), 0)
    with pytest.raises(DataError, match="data.options.root: '.*nowhere' is not a directory"):
        load_source(tv(tmp_path / "nowhere"), 0)
    with pytest.raises(DataError, match=r"data.options: torchvision FashionMNIST\(train=True\) on .* did not load: "
                                        r"Dataset not found"):
        load_source(tv(tmp_path), 0)
    with pytest.raises(DataError, match="data.options.download: torchvision ImageFolder cannot download"):
        load_source(tv(tmp_path, "ImageFolder", download=True), 0)
    with pytest.raises(ValueError, match="data.options.roots"):
        tv(tmp_path, roots="x")
    monkeypatch.setitem(sys.modules, "torchvision", None)  # as if the extra were not installed
    with pytest.raises(DataError, match=r"pip install 'raysim-fl\[torchvision\]'"):
        load_source(tv(tmp_path), 0)


def test_a_users_script_imports_torchvision_through_raysim():
    """A fresh process (no raysim import before it) gets torchvision's datasets from `raysim.data.import_torchvision`,
    on a torch whose torchvision wheel fails a plain import."""
    import subprocess
    import sys

    script = "import raysim.data; tv = raysim.data.import_torchvision(); print(tv.datasets.FashionMNIST.__name__)"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "FashionMNIST", proc.stderr[-500:]
