"""Client traces from files: speed factors (`client_id, speed`) and availability intervals (`client_id, start, end`),
Parquet or CSV, checked once, with errors that name the file and the offending row."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from raysim.errors import DataError


def read_trace(path: str | Path, columns: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The `columns` of a Parquet or CSV file (by its suffix) as arrays; DataError naming the file otherwise."""
    p = Path(path).expanduser()
    try:
        table: pa.Table = pacsv.read_csv(p) if p.suffix.lower() in (".csv", ".txt") else pq.read_table(p)
    except (OSError, pa.ArrowInvalid) as e:
        raise DataError(f"{p}: cannot read it as {'CSV' if p.suffix.lower() == '.csv' else 'Parquet'} ({e})") from None
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise DataError(f"{p}: has no column {missing[0]!r} (a trace has {', '.join(columns)})")
    return {c: table.column(c).to_numpy(zero_copy_only=False) for c in columns}


def _clients(path: str | Path, ids: np.ndarray, num_clients: int) -> np.ndarray:
    """The trace's client ids as int64, each one of the federation's; DataError naming the first that is not."""
    if not np.issubdtype(ids.dtype, np.integer):
        raise DataError(f"{path}: client_id must be integers, got {ids.dtype}")
    ids = ids.astype(np.int64)
    bad = np.flatnonzero((ids < 0) | (ids >= num_clients))
    if bad.size:
        raise DataError(f"{path}: row {bad[0]} names client {ids[bad[0]]}, but the federation has clients 0 to"
                        f" {num_clients - 1} (data.num_clients={num_clients})")
    return ids


def speed_trace(path: str | Path, num_clients: int) -> np.ndarray:
    """Every client's speed factor from `path` (each client listed once, speeds > 0), indexed by client id."""
    t = read_trace(path, ("client_id", "speed"))
    ids, speed = _clients(path, t["client_id"], num_clients), t["speed"].astype(np.float64)
    bad = np.flatnonzero(~(np.isfinite(speed) & (speed > 0)))
    if bad.size:
        raise DataError(f"{path}: row {bad[0]} gives client {ids[bad[0]]} speed {speed[bad[0]]}; speeds must be > 0")
    counts = np.bincount(ids, minlength=num_clients)
    if (counts != 1).any():
        c = int(np.flatnonzero(counts != 1)[0])
        raise DataError(f"{path}: lists client {c} {counts[c]} times; a speed trace lists each of the"
                        f" {num_clients} clients once")
    out = np.empty(num_clients)
    out[ids] = speed
    return out


def availability_trace(path: str | Path, num_clients: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(client, start, end) of every availability interval [start, end) in `path`, sorted by client and start,
    intervals that touch merged; DataError for an interval with end <= start or two of a client's that overlap."""
    t = read_trace(path, ("client_id", "start", "end"))
    ids = _clients(path, t["client_id"], num_clients)
    start, end = t["start"].astype(np.float64), t["end"].astype(np.float64)
    bad = np.flatnonzero(~(end > start))
    if bad.size:
        raise DataError(f"{path}: row {bad[0]} (client {ids[bad[0]]}) has start {start[bad[0]]} and end {end[bad[0]]};"
                        " an interval needs end > start")
    order = np.lexsort((start, ids))
    ids, start, end, rows = ids[order], start[order], end[order], order
    same = ids[1:] == ids[:-1]
    clash = np.flatnonzero(same & (start[1:] < end[:-1]))
    if clash.size:
        i = clash[0]
        raise DataError(f"{path}: rows {rows[i]} and {rows[i + 1]} give client {ids[i]} overlapping intervals"
                        f" [{start[i]}, {end[i]}) and [{start[i + 1]}, {end[i + 1]})")
    first = np.r_[True, ~(same & (start[1:] == end[:-1]))]  # an interval that does not continue the one before
    group = np.cumsum(first) - 1
    merged_end = np.zeros(int(first.sum()))
    np.maximum.at(merged_end, group, end)
    return ids[first], start[first], merged_end
