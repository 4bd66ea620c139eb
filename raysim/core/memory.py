"""Memory of a whole simulation: summed PSS of the driver and every process of its Ray session.

PSS (proportional set size) counts a page shared by k processes as 1/k in each, so the sum over
processes counts shared pages (torch's libraries, memory-mapped Parquet, the object store) once.
Ray workers rename themselves (`ray::ClientActor`), so they are found as descendants of the
session's raylet rather than by their command line.
"""
from __future__ import annotations

import os
import threading
import time

import psutil


def session_processes(session_dir: str, driver_pid: int | None = None) -> list[psutil.Process]:
    """The driver, the session's daemons (GCS, raylet: named by `session_dir`) and all their descendants."""
    roots = [psutil.Process(driver_pid or os.getpid())]
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(session_dir in arg for arg in p.info["cmdline"] or []):
                roots.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    found: dict[int, psutil.Process] = {}
    for root in roots:
        try:
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.NoSuchProcess:
            continue
    return list(found.values())


def pss_bytes(p: psutil.Process) -> int:
    """A process's PSS from /proc/PID/smaps_rollup (the kernel's own sum, ~0.2 ms; psutil's
    `memory_full_info().pss` parses all of smaps, ~7 ms for a torch process), else from psutil."""
    try:
        with open(f"/proc/{p.pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return p.memory_full_info().pss


def summed_pss(processes: list[psutil.Process]) -> tuple[int, int]:
    """(bytes of PSS summed over the processes still alive, how many were alive)."""
    total, alive = 0, 0
    for p in processes:
        try:
            total += pss_bytes(p)
            alive += 1
        except (psutil.Error, ProcessLookupError, PermissionError):
            continue
    return total, alive


class PeakMemory:
    """Samples summed PSS every `interval` seconds (or nine times as long as a sample took, if longer) in a
    background thread, so that measuring slows the measured run by at most a tenth; `peak` is the largest seen.

    `find()` returns the processes to measure (called at every sample, so actors started later count);
    `processes` is how many were alive at the peak.
    """

    def __init__(self, find, interval: float = 0.2):
        self.find, self.interval = find, interval
        self.peak, self.processes = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        total, alive = summed_pss(self.find())
        if total > self.peak:
            self.peak, self.processes = total, alive

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self._sample()
            # at most a tenth of a core: summing PSS walks every page table, tens of ms at 10^6 clients
            self._stop.wait(max(self.interval, 9 * (time.perf_counter() - t0)))

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
