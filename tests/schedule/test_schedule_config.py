"""The `schedule:` section: the staleness functions' closed forms and one-line errors for every field."""
import math

import pytest

from raysim.config import ConfigError, load_config
from raysim.schedule import StalenessConfig, staleness_weight

BASE = {
    "data": {"source": "digits", "num_clients": 20},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "rounds": 3, "clients_per_round": 5},
}


@pytest.mark.parametrize("kind, a, b, s, expected", [
    ("constant", 0.5, 4, 7, 1.0),
    ("polynomial", 0.5, 4, 3, 0.5),  # (1+3)^-1/2
    ("polynomial", 2.0, 4, 1, 0.25),
    ("hinge", 10.0, 4, 4, 1.0),  # within the threshold
    ("hinge", 10.0, 4, 6, 1 / 21),  # 1/(10*(6-4)+1)
    ("fedbuff", 0.5, 4, 8, 1 / 3),  # 1/sqrt(9)
])
def test_staleness_functions_have_their_closed_forms(kind, a, b, s, expected):
    assert staleness_weight(s, StalenessConfig(kind=kind, a=a, b=b)) == pytest.approx(expected, rel=1e-15)
    assert staleness_weight(0, StalenessConfig(kind=kind, a=a, b=b)) == 1.0  # a fresh update is applied unscaled


def test_defaults_are_the_papers():
    buffered = load_config({**BASE, "schedule": {"kind": "buffered"}}).schedule.resolved(5)
    assert (buffered.concurrency, buffered.buffer, buffered.staleness.kind) == (5, 5, "fedbuff")
    fedasync = load_config({**BASE, "schedule": {"kind": "async", "concurrency": 8}}).schedule.resolved(5)
    assert (fedasync.concurrency, fedasync.buffer, fedasync.staleness.kind) == (8, 1, "polynomial")
    assert staleness_weight(3, fedasync.staleness) == pytest.approx(1 / math.sqrt(4))


@pytest.mark.parametrize("schedule, extra, named", [
    ({"kind": "buffered", "concurrency": 4, "buffer": 6}, {}, "schedule.buffer: 6 arrivals"),
    ({"kind": "buffered", "buffer": 6}, {}, "concurrency 5"),  # the default concurrency, clients_per_round
    ({"kind": "async", "concurrency": 30}, {}, "schedule.concurrency: 30 clients training at once exceed"),
    ({"kind": "async", "buffer": 2}, {}, "schedule.buffer"),
    ({"kind": "sync", "concurrency": 4}, {}, "schedule.concurrency: for the buffered, async and semi_sync schedules"),
    ({"kind": "buffered"}, {"algorithm": {"name": "scaffold", "rounds": 3, "clients_per_round": 5}},
     "algorithm 'scaffold' cannot run buffered"),
    ({"kind": "async"}, {"privacy": {"clip": 1.0, "noise_multiplier": 1.0}}, "privacy: DP-FedAvg's accounting"),
    ({"kind": "buffered"}, {"system": {"stragglers": {"deadline": 5.0}}}, "system.stragglers"),
    ({"kind": "semi"}, {}, "schedule.kind"),
    ({"kind": "semi_sync"}, {}, "schedule.period: semi_sync closes its rounds"),
    ({"kind": "semi_sync", "period": 5.0, "concurrency": 3}, {}, "schedule.concurrency: semi_sync starts"),
    ({"kind": "buffered", "period": 5.0}, {}, "schedule.period: for the semi_sync schedule"),
    ({"kind": "sync"}, {"algorithm": {"name": "scaffold", "rounds": 3, "clients_per_round": 5},
                        "system": {"availability": {"kind": "markov"}}}, "system.availability: algorithm 'scaffold'"),
    ({"kind": "sync"}, {"system": {"availability": {"kind": "trace"}}}, "trace needs file"),
])
def test_a_schedule_mistake_is_one_line_naming_the_field(schedule, extra, named):
    with pytest.raises(ConfigError) as err:
        load_config({**BASE, **extra, "schedule": schedule})
    assert named in str(err.value) and "\n" not in str(err.value).strip()


def test_a_trace_is_checked_before_the_run_against_the_federation(tmp_path):
    avail = tmp_path / "avail.csv"
    avail.write_text("client_id,start,end\n0,0,10\n1,0,10\n2,5,10\n")
    few = {**BASE, "system": {"availability": {"kind": "trace", "file": str(avail)}},
           "schedule": {"kind": "async", "concurrency": 4}}
    with pytest.raises(ConfigError, match="only 3 clients are ever online, fewer than schedule.concurrency 4"):
        load_config(few)
    speed = tmp_path / "speed.csv"
    speed.write_text("client_id,speed\n" + "".join(f"{c},1.0\n" for c in range(21)))
    with pytest.raises(ConfigError, match=r"system.compute.speed_file: .*speed.csv: row 20 names client 20"):
        load_config({**BASE, "system": {"compute": {"speed": "trace", "speed_file": str(speed)}}})
