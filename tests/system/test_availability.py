"""Client availability against its definitions: Markov on/off periods (stationary share online, exponential
residual periods), the diurnal cycle, Bernoulli draws, and traces (intervals, merges, one-line errors)."""
import math

import numpy as np
import pytest

from raysim.errors import DataError
from raysim.system.availability import Availability
from raysim.system.config import AvailabilityConfig
from raysim.system.traces import availability_trace, speed_trace


def model(n=20_000, seed=1, **kw):
    return Availability(AvailabilityConfig(**kw), seed, n)


def test_markov_is_online_its_stationary_share_and_its_periods_are_exponential():
    """mean_on 30, mean_off 10: online 3/4 of the time at any t; an online client's remaining period is Exp(30)
    (memoryless), mean 30. 20,000 clients, 4 standard errors."""
    m = model(kind="markov", mean_on=30.0, mean_off=10.0)
    n = 20_000
    for t in (0.0, 7.5, 250.0, 1000.0):
        on = m.available(t, 0)
        assert abs(on.mean() - 0.75) < 4 * math.sqrt(0.75 * 0.25 / n)
        left = m.offline_at(np.flatnonzero(on), t) - t
        assert (left > 0).all() and abs(left.mean() - 30.0) < 4 * 30.0 / math.sqrt(on.sum())


def test_markov_answers_do_not_depend_on_the_queries_before():
    a, b = model(n=500, kind="markov", mean_on=5.0, mean_off=5.0), model(n=500, kind="markov", mean_on=5.0, mean_off=5.0)
    for t in (3.0, 40.0, 41.0):
        a.available(t, 0)
    np.testing.assert_array_equal(a.available(41.0, 0), b.available(41.0, 0))
    np.testing.assert_array_equal(a.available(12.0, 0), b.available(12.0, 0))  # back in time: started over
    np.testing.assert_array_equal(a.offline_at(np.arange(0, 500, 7), 12.0), b.offline_at(np.arange(0, 500, 7), 12.0))
    off = ~b.available(12.0, 0)
    wake = b.next_online(12.0)
    assert wake > 12.0 and (b.available(wake, 0) & off).any()


def test_diurnal_is_online_its_share_of_each_cycle():
    m = model(kind="diurnal", period=24.0, on_fraction=0.25)
    for t in (0.0, 5.0, 100.3):
        on = m.available(t, 0)
        assert abs(on.mean() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / 20_000)
        left = m.offline_at(np.flatnonzero(on), t) - t
        assert (left > 0).all() and (left <= 6.0).all()  # within the 6 hours of its day
    on = m.available(3.0, 0)
    np.testing.assert_array_equal(on, m.available(3.0 + 24.0 * 7, 0))  # the same every cycle


def test_bernoulli_is_a_fresh_draw_per_selection():
    m = model(kind="bernoulli", p=0.3)
    first, again, other = m.available(0.0, 4, "select0"), m.available(99.0, 4, "select0"), m.available(0.0, 4, "select1")
    assert abs(first.mean() - 0.3) < 4 * math.sqrt(0.21 / 20_000)
    np.testing.assert_array_equal(first, again)  # keyed by the selection, not the time
    assert (first != other).mean() > 0.3  # independent draws differ for 2p(1-p) = 42% of clients


def write_csv(path, header, rows):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def test_a_trace_gives_its_intervals_and_merges_those_that_touch(tmp_path):
    f = write_csv(tmp_path / "avail.csv", "client_id,start,end", [(2, 10, 20), (0, 0, 5), (2, 20, 30), (0, 8, 9)])
    m = model(n=4, kind="trace", file=str(f))
    assert m.available(4.9, 0).tolist() == [True, False, False, False]
    assert m.available(25.0, 0).tolist() == [False, False, True, False]
    assert m.offline_at(np.array([2]), 12.0).tolist() == [30.0]  # [10, 20) and [20, 30) are one period
    assert m.next_online(5.0) == 8.0 and m.next_online(30.0) == np.inf
    assert m.ever() == 2


@pytest.mark.parametrize("rows, named", [
    ([(0, 0, 5), (7, 1, 2)], "row 1 names client 7, but the federation has clients 0 to 3"),
    ([(0, 0, 5), (0, 4, 9)], "give client 0 overlapping intervals [0.0, 5.0) and [4.0, 9.0)"),
    ([(1, 5, 5)], "row 0 (client 1) has start 5.0 and end 5.0"),
])
def test_a_bad_availability_trace_is_one_line_naming_the_file_and_row(tmp_path, rows, named):
    f = write_csv(tmp_path / "t.csv", "client_id,start,end", rows)
    with pytest.raises(DataError, match=r"t\.csv: ") as err:
        availability_trace(f, 4)
    assert named in str(err.value)


def test_a_speed_trace_lists_every_client_once(tmp_path):
    good = write_csv(tmp_path / "s.csv", "client_id,speed", [(1, 0.5), (0, 2.0), (2, 1.0)])
    assert speed_trace(good, 3).tolist() == [2.0, 0.5, 1.0]
    with pytest.raises(DataError, match="lists client 2 0 times"):
        speed_trace(write_csv(tmp_path / "short.csv", "client_id,speed", [(0, 1.0), (1, 1.0)]), 3)
    with pytest.raises(DataError, match="has no column 'speed'"):
        speed_trace(write_csv(tmp_path / "cols.csv", "client_id,factor", [(0, 1.0)]), 1)
