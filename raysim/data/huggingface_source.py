"""`source: huggingface`: a Hugging Face dataset saved with `save_to_disk`, read with `datasets.load_from_disk`.

`data.options: {path: DIR, label: label, features: [image]}`. A DatasetDict gives its `split`
(default train) pooled with its `test_split` (default test, when present), which is marked as the
source's own test set (`data.test_split: source`). Feature columns are read like Parquet ones
(`raysim.data.columns`): numbers, sequences and arrays keep their shape, Image features decode to
channel-first arrays in [0, 1]; `data.feature_shape` sets the shape. Nothing is downloaded. Needs
the optional extra `huggingface`.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from raysim.core.distribution import needs_extra
from raysim.data.columns import features, is_feature
from raysim.data.partition import NATURAL
from raysim.data.sources import Source, class_indices, register_source
from raysim.errors import DataError

if TYPE_CHECKING:
    from raysim.data.config import DataConfig


class HuggingfaceOptions(BaseModel):
    """`data.options:` of `source: huggingface`."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="the directory written by Dataset.save_to_disk or DatasetDict.save_to_disk")
    split: str | None = Field(None, description="the training split of a DatasetDict (None: train)")
    test_split: str | None = Field(None, description="the split that is the source's own test set (None: test, if any)")
    label: str = Field("label", description="the column of class labels")
    features: list[str] | None = Field(None, description="the feature columns (None: every other column of numbers, "
                                       "arrays or images)")


def _saved_dir(cfg: DataConfig) -> Path:
    """data.options.path, which must be a directory: a dataset saved with save_to_disk."""
    options = cfg.source_options()
    assert isinstance(options, HuggingfaceOptions)
    path = Path(options.path).expanduser()
    if not path.is_dir():
        raise DataError(f"data.options.path: {options.path!r} is not a directory (source 'huggingface' reads "
                        f"a dataset saved with save_to_disk)")
    return path


def _load(path: Path, options: HuggingfaceOptions):
    """The saved Dataset, or DatasetDict, at path (options.path)."""
    try:
        import datasets
    except ImportError as e:
        raise DataError(needs_extra("data.source: 'huggingface'", "huggingface") + f" ({e})") from e
    try:
        return datasets.load_from_disk(str(path))
    except (FileNotFoundError, OSError, ValueError) as e:
        raise DataError(f"data.options.path: {options.path} is not a dataset saved with save_to_disk "
                        f"({str(e).splitlines()[0]})") from e


def _splits(loaded, options: HuggingfaceOptions) -> list:
    """[train] or [train, test] Datasets from what load_from_disk returned."""
    import datasets

    if isinstance(loaded, datasets.Dataset):
        given = [f"{k}: {v!r}" for k, v in (("split", options.split), ("test_split", options.test_split)) if v]
        if given:
            raise DataError(f"data.options: {options.path} holds one Dataset without splits, so {', '.join(given)} "
                            f"does not apply")
        return [loaded]
    names = list(loaded)
    train = options.split or "train"
    if train not in loaded:
        raise DataError(f"data.options.split: {options.path} has no split {train!r} (splits: {names})")
    if options.test_split is not None and options.test_split not in loaded:
        raise DataError(f"data.options.test_split: {options.path} has no split {options.test_split!r} (splits: {names})")
    test = options.test_split or ("test" if "test" in loaded and train != "test" else None)
    return [loaded[train]] + ([loaded[test]] if test else [])


def _columns(dataset, options: HuggingfaceOptions, client: str | None) -> list[str]:
    """The feature columns: the given ones (checked), or every feature-like column but the label and the `client`
    column (the natural partition's, which must be there)."""
    names = dataset.column_names
    if options.label not in names:
        raise DataError(f"data.options.label: no column {options.label!r} in {options.path} (columns: {names})")
    if client is not None and client not in names:
        raise DataError(f"data.client_column: no column {client!r} in {options.path} for the natural partition"
                        f" (columns: {names})")
    if options.features is None:
        schema = dataset.data.schema
        columns = [n for n in names if n not in (options.label, client) and is_feature(schema.field(n).type)]
    else:
        columns = options.features
        wrong = [n for n in columns if n not in names or n in (options.label, client)]
        if wrong:
            raise DataError(f"data.options.features: {wrong} are not feature columns of {options.path} "
                            f"(columns: {names}, label: {options.label!r})")
    if not columns:
        raise DataError(f"data.options.features: {options.path} has no columns of numbers, arrays or images")
    return columns


def _clients(cfg: DataConfig) -> int:
    """The distinct values of data.client_column over the splits read: the natural partition's clients."""
    options = cfg.source_options()
    assert isinstance(options, HuggingfaceOptions)
    parts = _splits(_load(_saved_dir(cfg), options), options)
    missing = [p.split for p in parts if cfg.client_column not in p.column_names]
    if missing:
        raise DataError(f"data.client_column: no column {cfg.client_column!r} in {options.path} to count the clients of")
    return len(set().union(*(p.unique(cfg.client_column) for p in parts)))


@register_source("huggingface", natural=True, options=HuggingfaceOptions, check=_saved_dir, count=_clients)
def huggingface(cfg: DataConfig, seed: int) -> Source:
    """The saved dataset's feature columns and class labels, its test split (if any) marked; under `partition:
    natural`, each sample's client from `data.client_column` (FEMNIST-style writer ids), numbered 0..K-1 in sorted
    order of its values."""
    options = cfg.source_options()
    assert isinstance(options, HuggingfaceOptions)
    parts = _splits(_load(_saved_dir(cfg), options), options)
    client = cfg.client_column if cfg.partition.kind == NATURAL else None
    columns = _columns(parts[0], options, client)
    xs, ys, owners, shapes = [], [], [], set()
    for i, part in enumerate(parts):
        if client is not None and client not in part.column_names:
            raise DataError(f"data.client_column: no column {client!r} in the {part.split} split of {options.path}")
        table = part.select_columns([*columns, options.label, *([client] if client else [])]).with_format("arrow")[:]
        if client is not None:
            owners.append(table.column(client).to_numpy(zero_copy_only=False))
        x, image_shape = features(table, columns, cfg.feature_shape, f"{options.path} ({part.split or f'part {i}'})")
        xs.append(x)
        ys.append(table.column(options.label).to_numpy())
        shapes.add((x.shape[1], image_shape))
    if len(shapes) > 1:
        raise DataError(f"data.options: the splits of {options.path} have samples of different shapes {list(shapes)}")
    y, found, classes = class_indices(np.concatenate(ys))
    label_feature = parts[0].features[options.label]
    num_classes = max(found, getattr(label_feature, "num_classes", 0) or 0)
    x = np.concatenate(xs)
    test = np.concatenate([np.full(len(p), i == 1) for i, p in enumerate(xs)])
    described = {"dataset": str(options.path), "label_column": options.label, "feature_columns": columns,
                 "client_column": client, "classes": getattr(label_feature, "names", None) or classes}
    natural = np.unique(np.concatenate(owners), return_inverse=True)[1].astype(np.int64) if client else None
    return Source(x, y, (x.shape[1],), num_classes, natural_clients=natural, image_shape=shapes.pop()[1],
                  test_mask=test if len(parts) == 2 else None, description=described)
