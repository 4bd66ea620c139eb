"""Arrow columns as per-sample arrays: nested lists, tensors and encoded images keep their shape."""
import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from raysim.data.columns import column_arrays, features
from raysim.errors import DataError


def png(pixels: np.ndarray, format: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=format)
    return buf.getvalue()


def test_array_columns_keep_their_shape():
    rng = np.random.default_rng(0)
    grid = rng.normal(size=(5, 4, 6)).astype(np.float32)
    volume = rng.normal(size=(5, 2, 3, 3)).astype(np.float32)
    table = pa.table({
        "grid": pa.array(grid.tolist()),  # list<list<double>>: (H, W), one channel
        "volume": pa.FixedShapeTensorArray.from_numpy_ndarray(volume),
        "flat": pa.FixedSizeListArray.from_arrays(pa.array(volume.reshape(-1)), 18),
    })
    x, shape = features(table, ["grid"], None, "t")
    assert shape == (1, 4, 6) and np.array_equal(x, grid.reshape(5, -1))
    x, shape = features(table, ["volume"], None, "t")
    assert shape == (2, 3, 3) and np.array_equal(x, volume.reshape(5, -1))
    x, shape = features(table, ["flat"], None, "t")
    assert shape is None and x.shape == (5, 18)
    x, shape = features(table, ["flat"], [2, 3, 3], "t")
    assert shape == (2, 3, 3) and np.array_equal(x.reshape(5, 2, 3, 3), volume)
    with pytest.raises(DataError, match=r"data.feature_shape: \[1, 4, 4\] needs 16 values .* 'flat' \(18,\)"):
        features(table, ["flat"], [1, 4, 4], "t")
    ragged = pa.table({"r": pa.array([[1.0, 2.0], [3.0]])})
    with pytest.raises(DataError, match="column 'r' of t has arrays of different lengths"):
        features(ragged, ["r"], None, "t")


def test_image_columns_decode_channel_first_in_unit_range():
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (3, 4, 6, 3), dtype=np.uint8)  # (n, H, W, C) as PIL holds them
    gray = rng.integers(0, 256, (3, 5, 5), dtype=np.uint8)
    table = pa.table({
        "rgb": pa.array([png(p) for p in rgb], pa.binary()),
        "hf": pa.array([{"bytes": png(p), "path": None} for p in gray]),  # Hugging Face's Image struct
        "jpeg": pa.array([png(p, "JPEG") for p in rgb], pa.binary()),
    })
    x, shape = features(table, ["rgb"], None, "t")
    assert shape == (3, 4, 6)
    assert np.array_equal(x.reshape(3, 3, 4, 6), rgb.transpose(0, 3, 1, 2) / np.float32(255))
    x, shape = features(table, ["hf"], None, "t")
    assert shape == (1, 5, 5) and np.array_equal(x.reshape(3, 5, 5), gray / np.float32(255))
    assert column_arrays(table.column("jpeg"), "t").shape == (3, 3, 4, 6)


def test_image_column_errors_name_the_row():
    mixed = pa.table({"im": pa.array([png(np.zeros((4, 4), np.uint8)), png(np.zeros((4, 5), np.uint8))])})
    with pytest.raises(DataError, match=r"column 'im' of t has samples of different shapes: \(1, 4, 4\) at row 0, "
                                        r"\(1, 4, 5\) at row 1"):
        features(mixed, ["im"], None, "t")
    with pytest.raises(DataError, match="row 1 is not an image PIL can read"):
        column_arrays(pa.array([png(np.zeros((4, 4), np.uint8)), b"not an image"]), "t")
    with pytest.raises(DataError, match="row 0 holds no image bytes"):
        column_arrays(pa.array([{"bytes": None, "path": "a.png"}], pa.struct([("bytes", pa.binary()),
                                                                              ("path", pa.string())])), "t")
