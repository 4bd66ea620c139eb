"""Files written atomically: through a temporary file beside the target, renamed over it, so a crash never
leaves a half-written table, checkpoint or config; and read back, a damaged one named in one line."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from raysim.errors import RunDirError, first_line

T = TypeVar("T")


def make_dir(path: Path, flag: str = "--out") -> None:
    """Create the directory `path` (and its parents) for results, or refuse in one line naming `flag` (RunDirError):
    a file is there, or it cannot be made."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{flag} {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"{flag} {path}: cannot create it ({e.strerror or type(e).__name__})") from None


def atomic_write_bytes(path: Path, write: Callable[[str], object]) -> None:
    """Write through `write(tmp_path)` to a temporary file beside `path`, then rename over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """Rows as a Parquet table, atomically: a crash never leaves a half-written file. The columns are
    every key of any row (null where a row lacks it, e.g. metrics of rounds between evaluations)."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = pa.table({k: [r.get(k) for r in rows] for k in keys})
    atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp))


def write_columns(columns: dict[str, Any], path: Path) -> None:
    """Columns (name: array, all of one length) as a Parquet table, atomically."""
    table = pa.table(columns)
    atomic_write_bytes(path, lambda tmp: pq.write_table(table, tmp))


def write_frame(frame: Any, path: Path) -> None:
    """A pandas DataFrame as Parquet (its index kept as pandas does), atomically."""
    atomic_write_bytes(path, lambda tmp: frame.to_parquet(tmp))


def write_text(text: str, path: Path) -> None:
    atomic_write_bytes(path, lambda tmp: Path(tmp).write_text(text))


def read_or_refuse(path: Path, read: Callable[[], T]) -> T:
    """`read()` of a run's file; a RunDirError naming `path` when it is damaged (truncated, not Parquet, JSON or YAML)."""
    try:
        return read()
    except (OSError, ValueError, pa.ArrowException, yaml.YAMLError) as e:
        problem = first_line(e)
        raise RunDirError(f"{path}: damaged, cannot be read ({problem})") from e
