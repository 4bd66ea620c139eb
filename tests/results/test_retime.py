"""Re-timing a run: run under system model A, retime to B, run under B: every simulated-time column
and Γ bitwise identical, and the other columns untouched; refusals when the kept clients could change."""
import json

import pandas as pd
import pytest

import raysim
from raysim.cli import main
from raysim.errors import ConfigError
from raysim.results import reproducible
from raysim.results.retime import RETIMED_CLIENTS, RETIMED_ROUNDS, retime

from conftest import STRAGGLERS

B = {"system.comm.mode": "explicit", "system.comm.nu": 3.0, "system.comm.phi": 0.5, "system.compute.rate": 2.0,
     "system.compute.unit": "sample", "system.compute.speed": "lognormal"}


def test_retimed_run_equals_the_run_under_the_new_model(tmp_path):
    a = raysim.run(STRAGGLERS, out=tmp_path / "a", backend="local")
    b = raysim.run(STRAGGLERS, B, out=tmp_path / "b", backend="local")
    status = main(["retime", str(a.run_dir), *[f"--set={k}={v}" for k, v in B.items()], "--out", str(tmp_path / "ab")])
    assert status == 0
    ab = raysim.RunResult.load(tmp_path / "ab")
    assert not a.rounds["sim_time"].equals(b.rounds["sim_time"]) and not a.rounds["gamma"].equals(b.rounds["gamma"])
    pd.testing.assert_frame_equal(reproducible(ab.rounds), reproducible(b.rounds), check_exact=True)
    pd.testing.assert_frame_equal(reproducible(ab.clients), reproducible(b.clients), check_exact=True)
    others = [c for c in a.rounds.columns if c not in RETIMED_ROUNDS]
    pd.testing.assert_frame_equal(ab.rounds[others], a.rounds[others])  # the measured wall times stay the run's own
    assert ab.config["system"]["comm"]["nu"] == 3.0 and ab.info["retimed_from"] == str(a.run_dir)
    a_again = {"system.comm.mode": "burke", "system.comm.phi": 2.0, "system.compute.rate": 1.0,
               "system.compute.unit": "batch", "system.compute.speed": "none"}  # STRAGGLERS' own model
    back = retime(tmp_path / "ab", a_again, tmp_path / "aba")
    for col in RETIMED_ROUNDS:
        assert back.rounds[col].equals(a.rounds[col]), col
    for col in RETIMED_CLIENTS:
        assert back.clients[col].equals(a.clients[col]), col


@pytest.mark.parametrize("recorded, new, named", [
    ({}, {"system.stragglers.deadline": 9.0}, "the new system model has a deadline"),
    ({"system.stragglers.over_select": 2}, {"system.comm.nu": 3.0}, "the recorded run has over-selection"),
    ({}, {"algorithm.lr": 0.5}, "algorithm.lr: retime changes only system.*"),
    ({"schedule.kind": "buffered", "schedule.buffer": 4}, {"system.comm.nu": 3.0}, "ran 'buffered', where the order"),
])
def test_retime_refuses_what_it_cannot_make_exact(tmp_path, recorded, new, named):
    run = raysim.run(STRAGGLERS, {"algorithm.rounds": 1, **recorded}, out=tmp_path / "r", backend="local")
    with pytest.raises(ConfigError, match=named.replace("*", r"\*")):
        retime(run.run_dir, new, tmp_path / "x")
    assert not (tmp_path / "x").exists()
