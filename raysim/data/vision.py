"""Image datasets of the FedFisher paper read from their standard on-disk formats.

Nothing is downloaded: `data.path` names a directory that holds the files (IDX for
FashionMNIST, the CIFAR python pickles, SVHN's .mat files, CINIC-10's png folders). Each source marks
its official test split (FashionMNIST t10k, CIFAR-10 test_batch, SVHN test_32x32, CINIC-10 test), which
the server tests on with `data.test_split: source`; with the default `holdout` the splits are pooled and
`data.test_fraction` is held out (1/7 gives FashionMNIST's 10,000 of 70,000). Pixels are scaled to [0, 1]
and normalized with the code's per-dataset constants; images are stored channel-first and flattened.
Also here: `digits28`, scikit-learn's digits upsampled to LeNet's 1x28x28 input.
"""
from __future__ import annotations

import gzip
import pickle
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from raysim.data.sources import Source, SourceLoader, register_source
from raysim.errors import DataError

if TYPE_CHECKING:
    from raysim.data.config import DataConfig

NORMALIZATION = {  # (mean, std) per channel, from the paper's data.py
    "fashion_mnist": ((0.1307,), (0.3081,)),
    "svhn": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # ToTensor only
    "cifar10": ((0.491, 0.482, 0.447), (0.247, 0.243, 0.262)),
    "cinic10": ((0.4789, 0.4723, 0.4305), (0.2421, 0.2383, 0.2587)),
}
CINIC_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _directory(cfg: DataConfig, name: str) -> Path:
    if cfg.path is None:
        raise DataError(f"data.path: source {name!r} needs the directory holding its files")
    path = Path(cfg.path)
    if not path.is_dir():
        raise DataError(f"data.path: {str(path)!r} is not a directory (source {name!r})")
    return path


def _folder_source(name: str) -> Callable[[SourceLoader], SourceLoader]:
    """Register a source read from the folder `data.path`, whose absence is found before Ray starts."""
    return register_source(name, check=partial(_directory, name=name))


def _find(root: Path, names: list[str], what: str) -> Path:
    """The first of `names` (relative paths) that exists under root, or a ValueError listing them."""
    for n in names:
        if (root / n).exists():
            return root / n
    raise DataError(f"data.path: no {what} under {root} (looked for {names})")


def _source(images: np.ndarray, labels: np.ndarray, test: np.ndarray, name: str) -> Source:
    """uint8 images [n, C, H, W] scaled to [0, 1], normalized per channel, flattened; `test` marks the official test split."""
    mean, std = (np.asarray(v, dtype=np.float32)[None, :, None, None] for v in NORMALIZATION[name])
    x = (images.astype(np.float32) / 255.0 - mean) / std
    shape = tuple(int(s) for s in images.shape[1:])
    return Source(x.reshape(len(x), -1), labels.astype(np.int64), (int(np.prod(shape)),), 10, image_shape=shape,
                  test_mask=np.asarray(test, dtype=bool))


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (optionally gzipped) as a uint8 array of its stated dimensions."""
    raw = (gzip.open if path.suffix == ".gz" else open)(path, "rb").read()
    if raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise DataError(f"data.path: {path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


@_folder_source("fashion_mnist")
def fashion_mnist(cfg: DataConfig, seed: int) -> Source:
    """FashionMNIST from its IDX files (in data.path or data.path/FashionMNIST/raw), 70,000 1x28x28 images."""
    root = _directory(cfg, "fashion_mnist")
    parts = []
    for split in ("train", "t10k"):
        arrays = []
        for kind in ("images-idx3", "labels-idx1"):
            names = [f"{d}{split}-{kind}-ubyte{z}" for d in ("", "FashionMNIST/raw/") for z in ("", ".gz")]
            arrays.append(read_idx(_find(root, names, f"FashionMNIST {split} {kind} file")))
        parts.append(arrays)
    images = np.concatenate([p[0] for p in parts])[:, None]
    test = np.concatenate([np.full(len(p[1]), split == "t10k") for p, split in zip(parts, ("train", "t10k"))])
    return _source(images, np.concatenate([p[1] for p in parts]), test, "fashion_mnist")


@_folder_source("cifar10")
def cifar10(cfg: DataConfig, seed: int) -> Source:
    """CIFAR-10 from the python pickles (cifar-10-batches-py/data_batch_1..5, test_batch), 60,000 3x32x32 images."""
    root = _directory(cfg, "cifar10")
    folder = _find(root, ["cifar-10-batches-py", "."], "cifar-10-batches-py folder")
    images, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(_find(folder, [name], f"CIFAR-10 batch {name}"), "rb") as f:
            batch = pickle.load(f, encoding="bytes")
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.append(np.asarray(batch[b"labels"]))
    test = np.concatenate([np.full(len(b), i == 5) for i, b in enumerate(labels)])
    return _source(np.concatenate(images), np.concatenate(labels), test, "cifar10")


@_folder_source("svhn")
def svhn(cfg: DataConfig, seed: int) -> Source:
    """SVHN from train_32x32.mat and test_32x32.mat (label 10 is the digit 0), 99,289 3x32x32 images."""
    from scipy.io import loadmat

    root = _directory(cfg, "svhn")
    images, labels = [], []
    for name in ("train_32x32.mat", "test_32x32.mat"):
        mat = loadmat(_find(root, [name], f"SVHN file {name}"))
        images.append(np.transpose(mat["X"], (3, 2, 0, 1)))
        labels.append(mat["y"].reshape(-1) % 10)
    test = np.concatenate([np.full(len(b), i == 1) for i, b in enumerate(labels)])
    return _source(np.concatenate(images), np.concatenate(labels), test, "svhn")


@_folder_source("cinic10")
def cinic10(cfg: DataConfig, seed: int) -> Source:
    """CINIC-10 from its png folders (<split>/<class>/*.png for the splits present: train, valid, test)."""
    from PIL import Image

    root = _directory(cfg, "cinic10")
    splits = [root / s for s in ("train", "valid", "test", "cinic_train", "cinic_test") if (root / s).is_dir()]
    if not splits:
        raise DataError(f"data.path: no CINIC-10 split folders (train, valid, test) under {root}")
    images, labels, test = [], [], []
    for split in splits:
        for label, cls in enumerate(CINIC_CLASSES):
            for png in sorted((split / cls).glob("*.png")):
                with Image.open(png) as im:
                    images.append(np.asarray(im.convert("RGB"), dtype=np.uint8).transpose(2, 0, 1))
                labels.append(label)
                test.append(split.name.endswith("test"))
    if not images:
        raise DataError(f"data.path: no png images in the CINIC-10 class folders under {root}")
    return _source(np.stack(images), np.asarray(labels), np.asarray(test), "cinic10")


@register_source("digits28")
def digits28(cfg: DataConfig, seed: int) -> Source:
    """scikit-learn's 8x8 digits upsampled (bilinear) to 1x28x28, pixels in [0, 1]: a LeNet-shaped stand-in."""
    import torch
    import torch.nn.functional as F
    from sklearn.datasets import load_digits

    data = load_digits()
    small = torch.tensor(data.images / 16.0, dtype=torch.float32)[:, None]
    x = F.interpolate(small, size=(28, 28), mode="bilinear", align_corners=False).numpy()
    return Source(x.reshape(len(x), -1), data.target.astype(np.int64), (784,), 10, image_shape=(1, 28, 28))
