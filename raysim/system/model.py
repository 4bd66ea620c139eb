"""The per-round system model: sampled compute/upload times, stragglers and Definition 1's Gamma.

A round runs three sequential phases (the FedLRGD paper, (25)): the clients' compute phase
(it ends with the slowest kept client, or at the deadline if one was missed), then the kept
clients' uploads through the server's queue, then the server's own oracle calls (Type B).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import cast

import numpy as np

from raysim.contract import Cost, Costs, as_costs
from raysim.core.rng import SERVER, stream
from raysim.system.availability import Availability
from raysim.system.compute import compute_time, speed_factors
from raysim.system.config import SystemConfig
from raysim.system.queue import burke_completions, explicit_completions
from raysim.system.traces import speed_trace


PREFIX_DRAWS = 1 << 22  # client ids below this take their compute-time uniforms from one prefix draw


@dataclass
class RoundTiming:
    """Sampled timing of one round; per-client arrays are in the order of the round's clients.

    upload_time: completion offset within the communication phase (0 if dropped or no upload).
    finish_time: compute phase end + upload_time for kept uploading clients, else compute time.
    gamma: this round's increment of the federated oracle complexity (Definition 1).
    """

    compute_time: np.ndarray
    upload_time: np.ndarray
    finish_time: np.ndarray
    dropped: np.ndarray
    compute_phase: float
    comm_phase: float
    server_phase: float
    round_time: float
    gamma: float
    offline: np.ndarray | None = None  # dropped for going offline mid-round (system.availability), when it can


@dataclass
class ClientPhases:
    """A round's clients' side: when the compute phase ends, each client's upload completion offset (0 without
    one), who is dropped (stragglers, and clients gone offline before their upload was done) and who went offline."""

    compute_phase: float
    upload: np.ndarray
    dropped: np.ndarray
    offline: np.ndarray


class SystemModel:
    """Samples one experiment's round timings; every draw keyed by (seed, round, client, purpose)."""

    def __init__(self, cfg: SystemConfig, seed: int, num_clients: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.num_clients = num_clients
        c = cfg.compute
        # lognormal factors are one draw for every client; equal speeds need no array (10^8 clients: 800 MB)
        self.speed: float | np.ndarray = (speed_factors(num_clients, c.speed_sigma, seed) if c.speed == "lognormal" else
                                          speed_trace(c.speed_file, num_clients) if c.speed == "trace" and c.speed_file else
                                          c.speed_factor if c.speed == "constant" else 1.0)
        self.availability = Availability(cfg.availability, seed, num_clients)

    def calls(self, cost: Cost) -> int:
        """Oracle calls of a cost in the configured unit: per-sample calls or minibatch steps."""
        return cost.oracle_calls if self.cfg.compute.unit == "sample" else cost.oracle_batches

    def calls_of(self, costs: Costs) -> np.ndarray:
        """Every client's oracle calls in the configured unit (`calls` of each)."""
        return costs.oracle_calls if self.cfg.compute.unit == "sample" else costs.oracle_batches

    def client_compute_times(self, round: int, clients: list[int] | np.ndarray, costs: Costs | list[Cost],
                             uniforms: np.ndarray | None = None) -> np.ndarray:
        """The clients' compute times b*shift + Erlang(b, rate) over their speed factors (FedLRGD Sec. II-D1).

        Client c's Erlang draw is the quantile of the c-th uniform of the round's stream (only the prefix
        up to the largest id is drawn), so it does not depend on which clients share its actor, and a
        whole shard costs one vectorized quantile. `uniforms`: the clients' `compute_uniforms`, drawn already
        (a shard draws them once and splits the quantiles over its threads).
        """
        c = self.cfg.compute
        idx = np.asarray(clients, dtype=np.int64)
        calls = self.calls_of(as_costs(costs)).astype(float)
        speed = self.speed[idx] if isinstance(self.speed, np.ndarray) else self.speed
        u = self.compute_uniforms(round, idx) if uniforms is None else uniforms
        return np.atleast_1d(compute_time(calls, u, c.shift, c.rate, speed, c.times == "fixed"))

    def compute_uniforms(self, round: int, idx: np.ndarray) -> np.ndarray:
        """Uniform number idx[i] of the round's "client_compute" stream for each i: the prefix up to the largest id
        drawn at once, or, beyond PREFIX_DRAWS, each taken alone from a copy of the stream advanced to it (a
        double is one 64-bit draw of PCG64), so 10^8 registered clients cost nothing per round but the round's."""
        gen = stream(self.seed, round, SERVER, "client_compute")
        if not idx.size or int(idx.max()) < PREFIX_DRAWS:
            return gen.random(int(idx.max()) + 1 if idx.size else 0)[idx]
        bits = cast(np.random.PCG64, gen.bit_generator)  # stream's bit generator
        out = np.empty(idx.size)
        for i, c in enumerate(idx.tolist()):
            out[i] = copy.deepcopy(bits).advance(c).random_raw() >> 11
        return out * 2.0**-53

    def server_compute_time(self, round: int, cost: Cost) -> float:
        """The server's compute time b*shift + Erlang(b, rate), mean 2b by default (20)."""
        c = self.cfg.compute
        return float(compute_time(self.calls(cost), stream(self.seed, round, SERVER, "compute"), c.shift, c.rate,
                                  fixed=c.times == "fixed"))

    def times_drop(self) -> bool:
        """Whether a round's compute times decide who is aggregated (a deadline, over-selection, clients going
        offline while they train, the real clock): then they are sampled before the aggregation; otherwise they only
        time the round, and can be sampled after it."""
        st = self.cfg.stragglers
        return (st.deadline is not None or st.over_select > 0 or self.availability.drops
                or self.cfg.clock.mode == "real")

    def within_deadline(self, compute_times: np.ndarray) -> np.ndarray:
        """Which clients finish their compute by the deadline (all of them without one); the one deadline rule."""
        times = np.asarray(compute_times, dtype=float)
        deadline = self.cfg.stragglers.deadline
        return times <= deadline if deadline is not None else np.ones(times.size, dtype=bool)

    def stragglers(
        self, clients: np.ndarray, compute_times: np.ndarray, keep: int | None
    ) -> tuple[np.ndarray, float]:
        """Drop clients slower than the deadline, then keep the `keep` earliest (ties by client id).

        Returns (dropped, compute phase end): see `_compute_phase_end`.
        """
        times = np.asarray(compute_times, dtype=float)
        dropped = ~self.within_deadline(times)
        alive = np.flatnonzero(~dropped)
        if keep is not None and alive.size > keep:
            by_time = alive[np.lexsort((np.asarray(clients)[alive], times[alive]))]
            dropped[by_time[keep:]] = True
        return dropped, self._compute_phase_end(times, dropped, keep)

    def _compute_phase_end(self, times: np.ndarray, dropped: np.ndarray, keep: int | None) -> float:
        """When the server stops waiting: at its `keep`-th reply once it has them all (the latest
        kept time), else at the deadline if any client missed it, else at the latest kept time (0 if none)."""
        kept = times[~dropped]
        deadline = self.cfg.stragglers.deadline
        if (keep is None or kept.size < keep) and not self.within_deadline(times).all():
            assert deadline is not None  # only a deadline makes a client miss it
            return float(deadline)
        return float(kept.max()) if kept.size else 0.0

    def client_phases(self, round: int, compute_times: np.ndarray, costs: Costs | list[Cost], dropped: np.ndarray,
                      keep: int | None = None, offline_after: np.ndarray | None = None) -> ClientPhases:
        """The compute phase's end and the kept clients' uploads through the round's queue; with `offline_after`
        (when each client goes offline, from the round's start), a client offline before its compute ends is
        dropped before the uploads are queued, and one offline before its upload is done is dropped after (it held
        the uplink until then)."""
        comm = self.cfg.comm
        times = np.asarray(compute_times, dtype=float)
        dropped = np.array(dropped, dtype=bool)
        offline = np.zeros(times.size, dtype=bool)
        if offline_after is not None:
            offline = ~dropped & (offline_after < times)
            dropped |= offline
        costs = as_costs(costs)
        sizes = np.where(dropped, 0.0, costs.upload_vectors) if len(costs) else np.zeros(0)
        rng = stream(self.seed, round, SERVER, "upload")
        if comm.mode == "burke":
            upload = burke_completions(sizes, comm.phi, rng)
        else:
            upload = explicit_completions(sizes, comm.phi, comm.nu, rng)
        compute_phase = self._compute_phase_end(times, dropped, keep)
        if offline_after is not None:
            if offline.any():  # the server learns that a client left when it leaves
                compute_phase = max(compute_phase, float(np.max(offline_after[offline])))
            lost = (sizes > 0) & (offline_after < compute_phase + upload)
            offline |= lost
            dropped |= lost
        return ClientPhases(compute_phase, upload, dropped, offline)

    def close_round(
        self,
        round: int,
        clients: np.ndarray,
        compute_times: np.ndarray,
        costs: Costs | list[Cost],
        server_cost: Cost,
        server_time: float,
        dropped: np.ndarray,
        keep: int | None = None,
        phases: ClientPhases | None = None,
    ) -> RoundTiming:
        """Queue the kept clients' uploads and add the phases: compute, comm, server (25); `keep` is
        the over-selection target the stragglers were chosen with (the compute phase ends at its reply);
        `phases`: the clients' side, taken already (`client_phases`, with availability).

        Gamma = b_t + phi * (delivered upload vectors), b_t = max kept client's calls + server calls
        (Definition 1; with phi = 0 it is the raw count of oracle calls in the configured unit). A client dropped at
        the deadline, by over-selection or offline delivers nothing, so its calls are not on the round's path.
        """
        times = np.asarray(compute_times, dtype=float)
        costs = as_costs(costs)
        ph = phases or self.client_phases(round, times, costs, dropped, keep)
        delivered = np.where(ph.dropped, 0.0, costs.upload_vectors) if len(costs) else np.zeros(0)
        comm_phase = float(ph.upload.max()) if ph.upload.size else 0.0
        finish = np.where(delivered > 0, ph.compute_phase + ph.upload, times)
        kept = self.calls_of(costs)[~ph.dropped] if len(costs) else np.zeros(0, dtype=np.int64)
        b_t = (int(kept.max()) if kept.size else 0) + self.calls(server_cost)
        return RoundTiming(
            compute_time=times,
            upload_time=np.where(ph.offline, 0.0, ph.upload),
            finish_time=finish,
            dropped=ph.dropped,
            compute_phase=ph.compute_phase,
            comm_phase=comm_phase,
            server_phase=float(server_time),
            round_time=ph.compute_phase + comm_phase + float(server_time),
            gamma=b_t + self.cfg.comm.phi * float(delivered.sum()),
            offline=ph.offline if phases is not None else None,
        )
