"""The timeline of a buffered or async run on its one simulated clock: clients in flight, arrivals and server
updates, and the staleness of what the server applied or dropped."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from raysim.report.figures import save_figure
from raysim.results import RunResult


def in_flight(clients: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(times, clients in flight from each time on) of the delivered tasks: each holds a slot from its start to its
    end (its arrival, or its going offline)."""
    times = np.r_[clients["start_time"].to_numpy(), clients["end_time"].to_numpy()]
    steps = np.r_[np.ones(len(clients)), -np.ones(len(clients))]
    order = np.lexsort((steps, times))  # at one instant, ends before starts: a freed slot's next client takes it
    return times[order], np.cumsum(steps[order])


def schedule_figure(result: RunResult):
    """Three panels against simulated time: clients in flight, cumulative arrivals with the server updates, and the
    staleness of each applied and dropped update."""
    clients, rounds = result.clients, result.rounds
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(9, 7), sharex=True, gridspec_kw={"height_ratios": [2, 2, 2]})
    t, n = in_flight(clients)
    top.step(t, n, where="post", color="tab:blue", linewidth=1, label="tasks delivered by the end")
    top.plot(rounds["sim_time"], rounds["in_flight"], "k.", markersize=4, label="all, at each update")
    top.set_ylabel("clients\nin flight")
    arrivals = np.sort(clients["end_time"].to_numpy())
    mid.step(arrivals, np.arange(1, arrivals.size + 1), where="post", color="tab:blue", label="arrivals (and losses)")
    mid.vlines(rounds["sim_time"], 0, arrivals.size, color="black", alpha=0.15, linewidth=0.6, label="server updates")
    mid.set_ylabel("arrivals")
    dropped, offline = clients["dropped"].astype(bool), clients["offline"].astype(bool)
    for name, sel, color, marker in (("applied", ~dropped, "tab:blue", "o"), ("too stale", dropped & ~offline,
                                     "tab:orange", "x"), ("went offline", offline, "tab:red", "v")):
        part = clients[sel]
        bottom.scatter(part["end_time"], part["staleness"], s=8, color=color, marker=marker, alpha=0.6, label=name)
    bottom.set_ylabel("staleness\n(server versions)")
    bottom.set_xlabel("simulated time")
    for ax in (top, mid, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    kind = result.config.get("schedule", {}).get("kind", "")
    top.set_title(f"{result.run_dir.name}: {kind} schedule, {len(rounds)} server updates, {len(clients)} tasks delivered",
                  fontsize=10)
    return fig


def plot_schedule(result: RunResult) -> Path | None:
    """Write schedule_timeline.png for a buffered or async run (None for a synchronous one)."""
    if result.config.get("schedule", {}).get("kind", "sync") == "sync" or result.clients.empty:
        return None
    return save_figure(schedule_figure(result), result.run_dir / "schedule_timeline.png", legend_outside=True)
