"""The client timeline of a run: when, within each round, its clients finished, and how many were kept
or dropped, over every round. A short run shows each client as a dot; a long one per-round (or, past
MAX_BINS rounds, per-window) quantile bands, so a 2,000-round run draws in about a second."""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import MaxNLocator

from raysim.report.figures import save_figure
from raysim.results import RunResult

DOTS_MAX_ROUNDS = 60  # beyond this many rounds (or DOTS_MAX_POINTS client rows) dots blur into a band: draw the band
DOTS_MAX_POINTS = 5_000
MAX_BINS = 200  # a longer run is drawn per window of ceil(rounds / MAX_BINS) rounds
QUANTILES = {0.0: "finish_min", 0.25: "finish_q1", 0.5: "finish_median", 0.75: "finish_q3", 1.0: "finish_max"}


def window(result: RunResult) -> int:
    """Rounds per drawn step of a run's timeline: 1 up to MAX_BINS rounds, then enough to draw MAX_BINS steps."""
    return max(1, math.ceil(result.rounds["round"].nunique() / MAX_BINS))


def timeline_data(result: RunResult, width: int = 1) -> pd.DataFrame:
    """One row per window of `width` rounds (per round by default), indexed by the window's last round: the mean
    `kept` and `dropped` clients a round, the min, quartiles and max `finish_time` of the kept clients (simulated
    seconds from their round's start) and `round_time`, the mean duration of its rounds. Every round of the run is in."""
    clients, rounds = result.clients, result.rounds
    index = pd.Index(sorted(set(rounds["round"]) | set(clients["round"])), name="round")
    last = pd.Series(index, index=index).groupby(lambda r: (r - index[0]) // width).transform("max")
    kept = ~clients["dropped"].astype(bool)
    per_round = pd.DataFrame({"kept": kept.groupby(clients["round"]).sum(), "dropped": (~kept).groupby(clients["round"]).sum()})
    per_round = per_round.reindex(index, fill_value=0)
    per_round["round_time"] = (rounds.set_index("round")["round_sim_time"].reindex(index)
                               if "round_sim_time" in rounds else float("nan"))
    data = per_round.groupby(last.to_numpy()).mean()
    finish = clients.loc[kept, "finish_time"].groupby(last.reindex(clients.loc[kept, "round"]).to_numpy())
    quantiles = finish.quantile(list(QUANTILES)).unstack().reindex(columns=list(QUANTILES))  # all NaN where none was kept
    data = data.join(quantiles.set_axis(list(QUANTILES.values()), axis=1))
    data.index.name = "round"
    return data


def is_long(result: RunResult) -> bool:
    """Whether the timeline is drawn as bands per round or window rather than one dot per client."""
    return result.clients["round"].nunique() > DOTS_MAX_ROUNDS or len(result.clients) > DOTS_MAX_POINTS


def _bands(ax, data: pd.DataFrame, width: int) -> None:
    x = data.index.to_numpy()
    ax.fill_between(x, data["finish_min"], data["finish_max"], color="tab:blue", alpha=0.18, linewidth=0,
                    label="kept clients: min-max")
    ax.fill_between(x, data["finish_q1"], data["finish_q3"], color="tab:blue", alpha=0.4, linewidth=0,
                    label="kept clients: quartiles")
    ax.plot(x, data["finish_median"], color="tab:blue", linewidth=1, label="kept clients: median")
    if data["round_time"].notna().any():
        ax.plot(x, data["round_time"], color="black", linewidth=0.8,
                label="round ends (with server)" if width == 1 else "round ends (with server), mean")


def _dots(ax, result: RunResult, data: pd.DataFrame) -> None:
    clients = result.clients.dropna(subset=["finish_time"])  # a late client has no finish time: counted below only
    for dropped, color, marker, name in ((False, "tab:blue", "o", "kept client"), (True, "tab:red", "x", "dropped client")):
        sel = clients[clients["dropped"].astype(bool) == dropped]
        ax.scatter(sel["round"], sel["finish_time"], s=10, color=color, marker=marker, label=name, alpha=0.7)
    if data["round_time"].notna().any():
        ax.scatter(data.index, data["round_time"], color="black", marker="_", s=80, label="round ends (with server)")


def timeline_figure(result: RunResult):
    """Finish times within the round above, kept and dropped clients below, against the round: finish times are
    offsets from their round's start, and the round lines up with the metrics-vs-round plot and the schedule."""
    width = window(result)
    data = timeline_data(result, width)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.2), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    if is_long(result):
        _bands(top, data, width)
        how = "per round" if width == 1 else f"per window of {width} rounds"
        step = None
    else:
        _dots(top, result, data)
        how, step = "one point per client", "mid"
    top.set_ylabel("finish time in its round\n(simulated s)")
    top.set_ylim(bottom=0)
    top.grid(alpha=0.3)
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    top.set_title(f"{result.run_dir.name}: client timeline, {len(result.rounds)} rounds ({how})", fontsize=10)
    x = data.index.to_numpy()
    total = data["kept"] + data["dropped"]
    bottom.fill_between(x, 0, data["kept"], step=step, color="tab:blue", alpha=0.6, linewidth=0, label="kept")
    bottom.fill_between(x, data["kept"], total, step=step, color="tab:red", alpha=0.6, linewidth=0, label="dropped")
    bottom.set_ylabel("clients\na round")
    bottom.set_xlabel("round")
    bottom.set_ylim(0, max(1.0, float(total.max())) * 1.1)
    bottom.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def plot_timeline(result: RunResult) -> Path | None:
    """Write client_timeline.png for a run that recorded client finish times; None for one that did not."""
    if result.clients.empty or "finish_time" not in result.clients:
        return None
    return save_figure(timeline_figure(result), result.run_dir / "client_timeline.png", legend_outside=True)
