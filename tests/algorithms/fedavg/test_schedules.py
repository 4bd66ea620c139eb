"""The FedBuff reproduction (`raysim schedules configs/fedavg/fedbuff.yaml`): under a wide spread of client speeds
FedBuff (C = 100, K = 10) reaches the target accuracy in a fraction of synchronous FedAvg's simulated time, FedAsync
too, and with nearly equal speeds buffering stops helping."""
from pathlib import Path

import pytest

from raysim.algorithms.fedavg.schedules import compare_schedules
from raysim.cli import main

CONFIG = Path(__file__).parents[3] / "configs" / "fedavg" / "fedbuff.yaml"


@pytest.mark.slow  # four runs at each of two spreads, about 60 s
def test_fedbuff_beats_synchronous_fedavg_only_when_speeds_differ(tmp_path):
    table = compare_schedules(CONFIG, (0.1, 1.5), 0.9, tmp_path).set_index(["sigma", "schedule", "clients_per_update"])
    wide, narrow = table.loc[1.5], table.loc[0.1]
    assert wide.loc[("buffered", 10), "time_ratio"] < 0.1 and wide.loc[("async", 1), "time_ratio"] < 0.2
    assert wide.loc[("sync", 100), "time_ratio"] > 1  # a round of C waits for the slowest of C
    buffered = narrow.loc[("buffered", 10)]
    assert not buffered["reached"] or buffered["time_ratio"] > 1
    assert (tmp_path / "schedules.md").read_text().count("\n") == 2 + 8


def test_the_command_refuses_a_config_without_a_buffered_schedule(tmp_path, capsys):
    quickstart = CONFIG.parent / "quickstart.yaml"
    assert main(["schedules", str(quickstart), "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err
    assert "schedule.kind: schedules compares against a buffered schedule" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()
