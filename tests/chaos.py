"""Fault schedules for the chaos tests: `raysim run` as a user starts it (a process group of its own, Ray started
by the driver), and, while its rounds run, what a cluster and an operator do to it: client actors killed, the
driver stopped, terminated or killed with everything it started, its newest checkpoint damaged; each ending of
the driver is followed by `raysim run --resume`, as a user would."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

KINDS = ("kill_actor", "kill_both", "stop_driver_kill_actor", "sigterm_resume", "sigkill_resume", "truncate_resume")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Schedule:
    """Faults, each `(seconds after the previous one (or after the rounds began), kind)`."""

    faults: list[tuple[float, str]]
    log: list[str] = field(default_factory=list)

    @classmethod
    def draw(cls, seed: int, most: int = 3, gap: tuple[float, float] = (0.2, 1.5)) -> Schedule:
        rng = np.random.default_rng(seed)
        return cls([(float(rng.uniform(*gap)), str(rng.choice(KINDS))) for _ in range(int(rng.integers(1, most + 1)))])


def client_actors(driver: psutil.Process) -> list[psutil.Process]:
    """The live client actor processes the driver's Ray started (Ray titles them `ray::ClientActor...`); none once
    the driver has exited (a run may finish between a schedule's check and this walk)."""
    found = []
    try:
        children = driver.children(recursive=True)
    except psutil.Error:
        return found
    for p in children:
        try:
            if p.cmdline()[:1] and p.cmdline()[0].startswith("ray::ClientActor") and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def _status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}


class Driver:
    """One `raysim run` (or `--resume`) process with its own process group."""

    def __init__(self, args: list[str], run_dir: Path, timeout_s: float):
        self.run_dir, self.deadline = run_dir, time.monotonic() + timeout_s
        before = (run_dir / "run.json").stat().st_mtime_ns if (run_dir / "run.json").exists() else None
        self.proc = subprocess.Popen([sys.executable, "-m", "raysim.cli", *args, "-q"], cwd=ROOT, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.ps = psutil.Process(self.proc.pid)
        while time.monotonic() < self.deadline and self.proc.poll() is None:  # until its rounds begin
            info = _status(run_dir)
            now = (run_dir / "run.json").stat().st_mtime_ns if (run_dir / "run.json").exists() else None
            if now != before and info.get("status") == "running" and "startup_s" in info and len(client_actors(self.ps)) >= 2:
                return
            time.sleep(0.02)

    def wait(self) -> tuple[int, str]:
        """The driver's exit status and stderr."""
        try:
            _, err = self.proc.communicate(timeout=max(1.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            _, err = self.proc.communicate()
            return -9, err + "\n(timed out)"
        return self.proc.returncode, err


def _live_actors(driver: Driver, timeout_s: float = 30.0) -> list[psutil.Process]:
    """The driver's two client actors, once both are up (Ray may still be restarting one a fault killed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and driver.proc.poll() is None:
        actors = client_actors(driver.ps)
        if len(actors) >= 2:
            return actors
        time.sleep(0.02)
    return client_actors(driver.ps)


def _kill(actors: list[psutil.Process], log: list[str], rng: np.random.Generator, both: bool = False) -> None:
    for i, p in enumerate(actors if both else [actors[int(rng.integers(len(actors)))]]):
        if i:
            time.sleep(0.05)
        try:
            p.kill()
            log.append(f"killed actor pid {p.pid}")
        except psutil.Error:
            log.append(f"actor pid {p.pid} was gone")


def _truncate_newest(run_dir: Path, log: list[str], rng: np.random.Generator) -> None:
    folders = sorted((run_dir / "checkpoints").glob("round-*"))
    if len(folders) < 2:  # the sole checkpoint damaged is refused by design (no intact checkpoint), not resumed
        log.append(f"{len(folders)} checkpoint(s): none truncated")
        return
    files = sorted(folders[-1].glob("*.pkl"))
    if files:
        path = files[int(rng.integers(len(files)))]
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
        log.append(f"truncated {path.relative_to(run_dir)}")


def run_schedule(config: Path, run_dir: Path, schedule: Schedule, seed: int, overrides: list[str],
                 timeout_s: float = 600.0) -> list[str]:
    """Run `config` into `run_dir` under `schedule`, resuming after every ending of the driver until the run
    finishes; returns what happened, line by line (the last line: the final exit status)."""
    rng, log = np.random.default_rng(seed + 1), schedule.log
    driver = Driver(["run", str(config), *overrides, "--out", str(run_dir)], run_dir, timeout_s)
    for gap, kind in schedule.faults:
        time.sleep(gap)
        actors = _live_actors(driver)
        if driver.proc.poll() is not None:
            code, err = driver.wait()
            log.append(f"{kind}: the run had ended (exit {code}: {err.strip()[-1000:]})")
            break
        log.append(f"{kind} ({len(actors)} actors)")
        if kind in ("kill_actor", "kill_both") and actors:
            _kill(actors, log, rng, both=kind == "kill_both")
        elif kind == "stop_driver_kill_actor":
            driver.ps.suspend()
            time.sleep(5.0)
            if actors:
                _kill(actors, log, rng)
            driver.ps.resume()
        else:
            if kind == "sigterm_resume":
                driver.ps.send_signal(signal.SIGTERM)
            else:
                os.killpg(driver.proc.pid, signal.SIGKILL)
            code, err = driver.wait()
            log.append(f"driver exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''}")
            if kind == "truncate_resume":
                _truncate_newest(run_dir, log, rng)
            driver = Driver(["run", "--resume", str(run_dir)], run_dir, timeout_s)
    code, err = driver.wait()
    while code != 0 and _status(run_dir).get("status") in ("interrupted", "running") and len(log) < 50:
        log.append(f"driver exit {code}: {err.strip()[-300:]}; resuming")
        code, err = Driver(["run", "--resume", str(run_dir)], run_dir, timeout_s).wait()
    log.append(f"finished: exit {code}" + (f": {err.strip()[-2000:]}" if code else ""))
    return log
