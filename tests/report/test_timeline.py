"""The client timeline covers every round of a run: dots for a short run, bands per round or window for a long one."""
import numpy as np
import pandas as pd
import pytest

from raysim.report.timeline import DOTS_MAX_ROUNDS, MAX_BINS, is_long, plot_timeline, timeline_data, timeline_figure, window
from raysim.results import RunResult


@pytest.fixture(scope="module")
def long_run(tmp_path_factory, synthetic_run):
    """More rounds than MAX_BINS: drawn per window of 3 rounds."""
    return RunResult.load(synthetic_run(tmp_path_factory.mktemp("runs") / "long", rounds=2 * MAX_BINS + 50))


def test_timeline_data_has_every_round_with_its_clients(long_run):
    clients, last = long_run.clients, int(long_run.rounds["round"].max())
    data = timeline_data(long_run)
    assert data.index.max() == last and len(data) == last
    final = clients[clients["round"] == last]
    assert data.loc[last, "kept"] == (~final["dropped"]).sum() == 6
    assert data.loc[last, "dropped"] == final["dropped"].sum() == 2  # the late client (no finish time) counts too
    assert data.loc[last, "finish_median"] == final.loc[~final["dropped"], "finish_time"].median()
    assert data.loc[last, "finish_max"] == final.loc[~final["dropped"], "finish_time"].max()
    assert data.loc[last, "round_time"] == long_run.rounds["round_sim_time"].iloc[-1]


def test_windows_of_a_long_run_end_at_its_last_round_and_pool_their_clients(long_run):
    data = timeline_data(long_run, width=3)
    last = int(long_run.rounds["round"].max())
    assert data.index.max() == last and len(data) == -(-last // 3)
    pooled = long_run.clients[long_run.clients["round"].between(4, 6)]
    kept = pooled.loc[~pooled["dropped"], "finish_time"]
    assert data.loc[6, "finish_median"] == kept.median() and data.loc[6, "finish_min"] == kept.min()
    assert data.loc[6, "round_time"] == pytest.approx(long_run.rounds["round_sim_time"].iloc[3:6].mean())


def test_a_long_run_is_drawn_as_bands_up_to_its_last_round(long_run):
    assert is_long(long_run) and window(long_run) == 3
    fig = timeline_figure(long_run)
    median = next(line for line in fig.axes[0].get_lines() if line.get_label() == "kept clients: median")
    last = long_run.rounds["round"].max()
    assert median.get_xdata()[-1] == last
    final = long_run.clients[long_run.clients["round"].between(last - 2, last)]
    assert median.get_ydata()[-1] == final.loc[~final["dropped"], "finish_time"].median()  # the last window is drawn
    path = plot_timeline(long_run)
    assert path == long_run.run_dir / "client_timeline.png" and path.stat().st_size > 10_000


def test_a_short_run_is_drawn_one_point_per_client(long_run):
    rounds = 20
    short = RunResult(long_run.run_dir, long_run.rounds[long_run.rounds["round"] <= rounds],
                      long_run.clients[long_run.clients["round"] <= rounds])
    assert rounds <= DOTS_MAX_ROUNDS and not is_long(short)
    points = np.concatenate([c.get_offsets() for c in timeline_figure(short).axes[0].collections])
    finished = short.clients.dropna(subset=["finish_time"])
    assert len(points) == len(finished) + rounds  # every client that finished, and each round's end
    assert points[:, 0].max() == rounds
    assert sorted(points[:, 1]) == sorted([*finished["finish_time"], *short.rounds["round_sim_time"]])


def test_a_run_without_client_rows_has_no_timeline(long_run):
    assert plot_timeline(RunResult(long_run.run_dir, long_run.rounds, pd.DataFrame())) is None
