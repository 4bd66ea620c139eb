"""Arrow columns as per-sample arrays: numbers, (nested) lists, tensors and encoded images.

Shared by the sources that read a user's own table (Parquet, a Hugging Face dataset on disk) so
that image and array columns keep their shape for CNNs. A number is one feature; a (nested, fixed-
size or variable) list or a fixed-shape tensor is an array of its own shape; an image (PNG/JPEG
bytes, or the {bytes, path} struct that Hugging Face's Image feature stores) is a channel-first
uint8 array, scaled to [0, 1].
"""
from __future__ import annotations

import io
import math
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from raysim.errors import DataError

GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")
FINITE_CHUNK_ROWS = 1 << 16  # rows tested at once when a NaN or inf is searched for


def _is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _storage(t: pa.DataType) -> pa.DataType:
    """The type an extension type (a tensor, Hugging Face's Array2D) stores its values as."""
    return t.storage_type if isinstance(t, pa.ExtensionType) else t


def _is_image(t: pa.DataType) -> bool:
    """Encoded image bytes, or a struct with a `bytes` field (Hugging Face's Image feature)."""
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return True
    return pa.types.is_struct(t) and t.get_field_index("bytes") >= 0


def is_feature(t: pa.DataType) -> bool:
    """True for a column that gives each sample an array: a number, a (nested) list of numbers, a tensor, an image."""
    t = _storage(t)
    while _is_list(t):
        t = _storage(t.value_type)
    return _is_number(t) or _is_image(t)


def image_array(image) -> np.ndarray:
    """A PIL image as a channel-first uint8 array: (1, H, W) for grayscale modes, (3, H, W) otherwise."""
    image = image.convert("L" if image.mode in GRAY_MODES else "RGB")
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def same_shape(arrays: Sequence[np.ndarray], what: str) -> np.ndarray:
    """Stack per-sample arrays that must share one shape; a DataError names the first two shapes that differ."""
    first = arrays[0].shape if len(arrays) else ()
    for i, a in enumerate(arrays):
        if a.shape != first:
            raise DataError(f"{what} has samples of different shapes: {first} at row 0, {a.shape} at row {i}")
    return np.stack(arrays) if len(arrays) else np.empty((0,), np.uint8)


def _images(arr: pa.Array, what: str) -> np.ndarray:
    """Decode each row's image bytes with PIL: (n, C, H, W) float32 in [0, 1]."""
    from PIL import Image, UnidentifiedImageError

    blobs = arr.field("bytes") if pa.types.is_struct(arr.type) else arr
    if blobs.null_count:
        row = int(np.flatnonzero(blobs.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{what}: row {row} holds no image bytes (a path only); embed the images in the table")
    decoded = []
    for i, blob in enumerate(blobs.to_pylist()):
        try:
            with Image.open(io.BytesIO(blob)) as im:
                decoded.append(image_array(im))
        except (UnidentifiedImageError, OSError) as e:
            raise DataError(f"{what}: row {i} is not an image PIL can read ({str(e).splitlines()[0]})") from e
    return same_shape(decoded, what).astype(np.float32) / 255.0


def _nested(arr: pa.Array, what: str) -> np.ndarray:
    """A (nested) list column of numbers as (n, d1, d2, ...); every row must have the same lengths."""
    n, shape = len(arr), []
    while _is_list(_storage(arr.type)):
        if isinstance(arr, pa.ExtensionArray):
            arr = arr.storage
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if len(lengths) and lengths.min() != lengths.max():
            raise DataError(f"{what} has arrays of different lengths ({lengths.min()} and {lengths.max()}); "
                            f"every sample needs the same shape")
        shape.append(int(lengths[0]) if len(lengths) else 0)
        arr = arr.flatten()
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    if arr.null_count:
        raise DataError(f"{what} contains nulls")
    return arr.to_numpy(zero_copy_only=False).astype(np.float32).reshape(n, *shape)


def first_non_finite(x: np.ndarray) -> int | None:
    """The first row of `x` holding NaN or inf, or None; a finite array costs a min and a max, allocating nothing."""
    if x.size == 0 or not np.issubdtype(x.dtype, np.floating) or np.isfinite(x.min()) and np.isfinite(x.max()):
        return None
    rows = x.reshape(len(x), -1)
    for start in range(0, len(rows), FINITE_CHUNK_ROWS):
        bad = ~np.isfinite(rows[start:start + FINITE_CHUNK_ROWS]).all(axis=1)
        if bad.any():
            return start + int(np.argmax(bad))
    return None


def column_arrays(column: pa.ChunkedArray | pa.Array, what: str) -> np.ndarray:
    """One column as float32 (n, *sample_shape): () for numbers, the list/tensor shape, (C, H, W) for images.
    A NaN or inf is a DataError naming its row: it would otherwise surface as a diverged run after training starts."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr.type, pa.FixedShapeTensorType):
        values = arr.to_numpy_ndarray().astype(np.float32)
    elif not is_feature(arr.type):
        raise DataError(f"{what} of type {arr.type} is neither numbers, arrays of numbers nor images")
    elif _is_image(_storage(arr.type)):
        return _images(arr.storage if isinstance(arr, pa.ExtensionArray) else arr, what)
    else:
        values = _nested(arr, what)
    row = first_non_finite(values)
    if row is not None:
        bad = values[row].reshape(-1)
        raise DataError(f"{what}: row {row} holds {bad[~np.isfinite(bad)][0]}; features must be finite numbers")
    return values


def features(table: pa.Table, names: Sequence[str], feature_shape: Sequence[int] | None,
             where: str) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """The feature columns of `table` as one flat (n, m) float32 matrix and the image shape of a sample.

    With `feature_shape` ([C, H, W] or [C, L]), the columns' values per sample must number
    prod(feature_shape), which becomes the image shape. Without it, a single column whose arrays
    are (C, H, W) keeps that shape and one of (H, W) becomes (1, H, W); anything else is flat.
    """
    if table.num_rows == 0:
        raise DataError(f"{where} has no rows")
    arrays = [column_arrays(table.column(n), f"column {n!r} of {where}") for n in names]
    shapes = [a.shape[1:] for a in arrays]
    x = np.concatenate([a.reshape(len(a), -1) for a in arrays], axis=1)
    if feature_shape is not None:
        need = math.prod(feature_shape)
        if x.shape[1] != need:
            got = ", ".join(f"{n!r} {s}" for n, s in zip(names, shapes))
            raise DataError(f"data.feature_shape: {list(feature_shape)} needs {need} values per sample, but the "
                            f"columns of {where} give {x.shape[1]} (shape per sample: {got})")
        return np.ascontiguousarray(x), tuple(int(s) for s in feature_shape)
    image_shape = None
    if len(shapes) == 1 and len(shapes[0]) in (2, 3):
        image_shape = shapes[0] if len(shapes[0]) == 3 else (1, *shapes[0])
    return np.ascontiguousarray(x), image_shape
