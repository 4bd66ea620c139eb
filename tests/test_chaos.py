"""Chaos: the quickstart (200 rounds, 2 client actors, `driver_shard: false`) under schedules of faults drawn from
{kill -9 a client actor, kill -9 both 50 ms apart, SIGSTOP the driver 5 s then kill an actor, SIGTERM the driver then
`--resume`, SIGKILL the driver's process group then `--resume`, truncate the newest checkpoint before `--resume`};
every run ends with tables bitwise equal to a clean run's. Three fixed schedules run in `make test`; the twenty
drawn ones are `-m slow`."""
import json

import pandas as pd
import pytest

import raysim
from raysim.results import RunResult, reproducible

from chaos import ROOT, Schedule, run_schedule

QUICK = ROOT / "configs/fedavg/quickstart.yaml"
OVERRIDES = ["algorithm.rounds=200", "cluster.num_actors=2", "cluster.driver_shard=false"]
FAST = {
    "kill both actors 50 ms apart, then SIGTERM and resume": Schedule([(0.3, "kill_both"), (0.5, "sigterm_resume")]),
    "SIGSTOP the driver 5 s and kill an actor meanwhile": Schedule([(0.3, "stop_driver_kill_actor")]),
    "SIGKILL everything, truncate the newest checkpoint, resume": Schedule([(1.0, "truncate_resume")]),
}


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The run without faults (on the local backend: the same bits as on Ray)."""
    return raysim.run(QUICK, [*OVERRIDES, "backend=local"], out=tmp_path_factory.mktemp("clean") / "run")


def check(clean, run_dir, schedule, seed):
    log = run_schedule(QUICK, run_dir, schedule, seed, OVERRIDES)
    assert log[-1] == "finished: exit 0", "\n".join(log)
    missed = sum("the run had ended" in line for line in log)  # drawn after the run's end: the rest are skipped
    assert missed < len(schedule.faults), "\n".join(log)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    result = RunResult.load(run_dir)
    for table in ("rounds", "clients"):
        pd.testing.assert_frame_equal(reproducible(getattr(clean, table)), reproducible(getattr(result, table)))
    return log


SLOW = {"kill both actors 50 ms apart, then SIGTERM and resume", "SIGSTOP the driver 5 s and kill an actor meanwhile"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in FAST])
def test_a_schedule_of_faults_ends_with_the_clean_runs_tables(clean, tmp_path, name):
    log = check(clean, tmp_path / "run", FAST[name], seed=len(name))
    assert not any("the run had ended" in line for line in log), "\n".join(log)  # each fault hit the running run


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_twenty_random_schedules_end_with_the_clean_runs_tables(clean, tmp_path, seed):
    schedule = Schedule.draw(seed)
    log = check(clean, tmp_path / "run", schedule, seed)
    print(f"schedule {seed}: {schedule.faults}\n  " + "\n  ".join(log))
