"""`source: torchvision`: any image-classification dataset of `torchvision.datasets`, read from a local root.

`data.options: {name: FashionMNIST, root: DIR}` builds the class on its own on-disk files; it
downloads only with `download: true`. A class with a `train` flag or a `split` argument gives its
train and test splits pooled, the test split marked as the source's own (`data.test_split: source`);
any other class (ImageFolder) gives one split. Images become channel-first arrays in [0, 1].
Needs the optional extra `torchvision`.
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raysim.core.distribution import needs_extra
from raysim.data.columns import image_array, same_shape
from raysim.data.sources import Source, class_indices, register_source
from raysim.errors import DataError

if TYPE_CHECKING:
    from raysim.data.config import DataConfig

_SCHEMAS: dict[str, Any] = {}  # torchvision's op schemas defined here when its compiled ops do not load (kept alive)


class TorchvisionOptions(BaseModel):
    """`data.options:` of `source: torchvision`."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="a class of torchvision.datasets, e.g. FashionMNIST, CIFAR10, SVHN, ImageFolder")
    root: str = Field(description="the directory the class reads its files from")
    download: bool = Field(False, description="let torchvision download the files into root (never by default)")
    args: dict[str, Any] = Field(default_factory=dict, description="further keyword arguments of the class, "
                                 "e.g. {split: balanced} for EMNIST")


def import_torchvision():
    """torchvision, importable on a CPU-only torch.

    PyPI's Linux wheels of torchvision are CUDA builds: on the CPU torch their compiled ops do not
    load, which torchvision tolerates except for two op registrations at import time (nms, qnms).
    Then the schemas of those two ops are defined here, so the package and its datasets (pure
    Python) import; calling those ops would still fail.
    """
    try:
        import torchvision
    except ImportError as e:
        raise DataError(needs_extra("data.source: 'torchvision'", "torchvision") + f" ({e})") from e
    except RuntimeError as e:
        if "torchvision::" not in str(e):
            raise
        import torch

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        lib = _SCHEMAS.setdefault("lib", torch.library.Library("torchvision", "DEF"))
        for op in ("nms", "qnms"):
            lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        import torchvision
    return torchvision


def dataset_classes(torchvision) -> list[str]:
    """The names of torchvision's dataset classes."""
    from torch.utils.data import Dataset

    datasets = torchvision.datasets
    return sorted(n for n in datasets.__all__
                  if isinstance(getattr(datasets, n), type) and issubclass(getattr(datasets, n), Dataset))


def _splits(cls: type, options: TorchvisionOptions) -> list[dict[str, Any]]:
    """Keyword arguments of the train and test splits where the class has them, else of its one split."""
    params = inspect.signature(cls).parameters
    if "train" in params and "train" not in options.args:
        return [{"train": True}, {"train": False}]
    if "split" in params and "split" not in options.args:
        return [{"split": "train"}, {"split": "test"}]
    return [{}]


def _arrays(dataset, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, C, H, W) float32 in [0, 1], integer targets) of every sample of a torchvision dataset."""
    from PIL import Image

    images, targets = [], []
    for i in range(len(dataset)):
        image, target = dataset[i]
        if isinstance(image, Image.Image):
            image = image_array(image)
        if not isinstance(target, (int, np.integer)):
            raise DataError(f"data.options.name: {what} has targets of type {type(target).__name__} at row {i}; "
                            f"source 'torchvision' takes class labels (int)")
        images.append(np.asarray(image))
        targets.append(int(target))
    x = same_shape(images, what)
    x = x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)
    return x, np.asarray(targets, dtype=np.int64)


@register_source("torchvision", options=TorchvisionOptions)
def torchvision_dataset(cfg: DataConfig, seed: int) -> Source:
    """The class `options.name` of torchvision.datasets on `options.root`, its splits pooled (test marked)."""
    options = cfg.source_options()
    assert isinstance(options, TorchvisionOptions)
    torchvision = import_torchvision()
    names = dataset_classes(torchvision)
    if options.name not in names:
        raise DataError(f"data.options.name: torchvision {torchvision.__version__} has no dataset {options.name!r} "
                        f"(datasets: {', '.join(names)})")
    cls = getattr(torchvision.datasets, options.name)
    takes_download = "download" in inspect.signature(cls).parameters
    if options.download and not takes_download:
        raise DataError(f"data.options.download: torchvision {options.name} cannot download; put its files under root")
    root = str(Path(options.root).expanduser())
    if not options.download and not Path(root).is_dir():
        raise DataError(f"data.options.root: {options.root!r} is not a directory (torchvision {options.name} reads its "
                        f"files from there; download: true fetches them)")
    common = {**options.args, **({"download": options.download} if takes_download else {})}
    parts = []
    for split in _splits(cls, options):
        what = f"torchvision {options.name}({', '.join(f'{k}={v!r}' for k, v in split.items())}) on {options.root}"
        try:
            dataset = cls(root, **common, **split)
        except (RuntimeError, OSError, ValueError, TypeError) as e:
            raise DataError(f"data.options: {what} did not load: {str(e).splitlines()[0]}") from e
        parts.append((*_arrays(dataset, what), len(getattr(dataset, "classes", ()) or ())))
    shapes = {p[0].shape[1:] for p in parts}
    if len(shapes) > 1:
        raise DataError(f"data.options.name: the splits of torchvision {options.name} have images of shapes {sorted(shapes)}")
    x = np.concatenate([p[0] for p in parts])
    y, found, _ = class_indices(np.concatenate([p[1] for p in parts]))
    test = np.concatenate([np.full(len(p[1]), i == 1) for i, p in enumerate(parts)])
    shape = tuple(int(s) for s in x.shape[1:])
    return Source(x.reshape(len(x), -1), y, (int(np.prod(shape)),), max(found, *(p[2] for p in parts)),
                  image_shape=shape, test_mask=test if len(parts) == 2 else None)
