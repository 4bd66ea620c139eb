"""`raysim report` on a buffered run draws its one clock: clients in flight, arrivals and updates, staleness."""
import numpy as np

import raysim
from raysim.report import report
from raysim.report.schedule import in_flight

CFG = {
    "name": "report_buffered", "seed": 1, "backend": "local",
    "data": {"source": "digits", "num_clients": 20},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "rounds": 10, "clients_per_round": 5, "lr": 0.1, "local_steps": 3, "batch_size": 8},
    "system": {"compute": {"unit": "batch"}},
    "schedule": {"kind": "buffered", "concurrency": 6, "buffer": 2},
}


def test_a_buffered_run_gets_the_schedule_timeline_and_no_round_timeline(tmp_path):
    run = raysim.run(CFG, out=tmp_path / "run", progress=False)
    written = {p.name for p in report(run.run_dir)}
    assert "schedule_timeline.png" in written and "client_timeline.png" not in written
    t, n = in_flight(run.clients)
    assert n.min() >= 0 and n.max() == 6 and n[-1] == 0  # never more than C at once (ends before starts)
    assert np.all(np.diff(t) >= 0)
    assert (run.rounds["in_flight"] <= 6).all()
