"""The event-driven simulated clock of the buffered and async schedules: client tasks start, compute, queue their
uploads and arrive at the server, event by event (ties by client id; all of an instant's events before its starts).

Pure bookkeeping, no training and no Ray: the engine (raysim.round.scheduled) times a task when it starts, from the
Costs its step will have, and trains later, every task that starts from one server version at once.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from raysim.contract import Cost
from raysim.system.queue import CarriedQueue

COMPUTE_END, UPLOAD_END, OFFLINE = 0, 1, 2


@dataclass
class Task:
    """One client's task: trained from server `version` (receiving `download` bytes), started at `start`, computing
    for `compute` until `compute_end`, its upload (service time `service` at the queue) leaving the queue at
    `upload_end`, when it reaches the server."""

    seq: int
    client: int
    version: int
    start: float
    compute: float
    service: float
    cost: Cost
    upload_end: float = math.nan
    staleness: int = -1  # server versions since `version` when it arrived
    download: int = 0
    offline: float = math.inf  # when the client goes offline (system.availability)
    lost: bool = False  # it went offline before its upload was done
    ended: float = math.nan  # when it left its slot: its arrival, or its going offline

    @property
    def compute_end(self) -> float:
        return self.start + self.compute


@dataclass
class Timeline:
    """The clock's state: the pending events (a heap of (time, client, kind, seq)), the tasks in flight, the upload
    queue, the arrivals buffered for the next update and those dropped as too stale since the last one. Every
    field is plain data, so a checkpoint pickles it and a resumed run goes on from the same instant."""

    concurrency: int
    buffer: int
    max_staleness: int | None = None
    now: float = 0.0
    version: int = 0
    events: list[tuple[float, int, int, int]] = field(default_factory=list)
    tasks: dict[int, Task] = field(default_factory=dict)  # in flight, by seq
    in_flight: set[int] = field(default_factory=set)  # their clients
    resting: set[int] = field(default_factory=set)  # started from the current version, or buffered for its update
    starts: int = 0  # draws of clients to start (or of their availability) at the current version
    queue: CarriedQueue = field(default_factory=CarriedQueue)
    arrived: list[Task] = field(default_factory=list)
    dropped: list[Task] = field(default_factory=list)
    next_seq: int = 0
    updated_at: float = 0.0  # the simulated time of the last server update

    def settled(self) -> bool:
        """Whether every event of the present instant is processed (clients may start now)."""
        return not self.events or self.events[0][0] > self.now

    def free(self) -> int:
        """Slots for clients to start in: the concurrency less the tasks in flight."""
        return self.concurrency - len(self.in_flight)

    def eligible(self, num_clients: int) -> np.ndarray:
        """The clients that may start now, in id order: not in flight, not started from the current version already
        (a task is keyed by its client and version), and with no arrival buffered (an update holds a client once)."""
        busy = np.fromiter(self.in_flight | self.resting, dtype=np.int64)
        return np.setdiff1d(np.arange(num_clients, dtype=np.int64), busy, assume_unique=True)

    def start(self, clients: np.ndarray, compute_times: np.ndarray, services: np.ndarray, costs: list[Cost],
              offline: np.ndarray) -> list[Task]:
        """Start `clients` now from the current version; their compute times, upload services and the times they go
        offline (inf: not before they are done) are sampled."""
        out = []
        for c, t, s, cost, gone in zip(clients.tolist(), compute_times.tolist(), services.tolist(), costs,
                                       offline.tolist()):
            task = Task(self.next_seq, c, self.version, self.now, t, s, cost, offline=gone)
            self.next_seq += 1
            self.tasks[task.seq] = task
            self.in_flight.add(c)
            self.resting.add(c)
            self._next(task, task.compute_end, COMPUTE_END)
            out.append(task)
        return out

    def _next(self, task: Task, at: float, kind: int) -> None:
        """Schedule `task`'s next event at `at`, or its going offline if that comes first."""
        if task.offline < at:
            at, kind = task.offline, OFFLINE
        heapq.heappush(self.events, (at, task.client, kind, task.seq))

    def step(self) -> None:
        """Process the next event: a compute end queues the upload (which holds the uplink for its service even if the
        client then goes offline); an upload end is an arrival, buffered or, staler than `max_staleness`, dropped;
        a client going offline first is dropped as lost. Each of the last three frees a slot."""
        time, client, kind, seq = heapq.heappop(self.events)
        self.now = time
        task = self.tasks[seq]
        if kind == COMPUTE_END:
            task.upload_end = self.queue.depart(time, task.service)
            self._next(task, task.upload_end, UPLOAD_END)
            return
        del self.tasks[seq]
        self.in_flight.discard(client)
        task.staleness, task.ended = self.version - task.version, time
        if kind == OFFLINE:
            task.lost = True
            self.dropped.append(task)
        elif self.max_staleness is not None and task.staleness > self.max_staleness:
            self.dropped.append(task)
        else:
            self.arrived.append(task)
            self.resting.add(client)

    def full(self) -> bool:
        """Whether the buffer holds an update's arrivals."""
        return len(self.arrived) >= self.buffer

    def update(self) -> tuple[list[Task], list[Task]]:
        """Take the buffer's arrivals and the drops since the last update, and move to the next server version."""
        arrived, dropped = self.arrived, self.dropped
        self.arrived, self.dropped = [], []
        self.version += 1
        self.resting, self.starts, self.updated_at = set(), 0, self.now
        return arrived, dropped
