"""Summed PSS of a whole simulation, and the memory bound of a 10^4-client run (benchmarks/scale.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest

from raysim.core.memory import PeakMemory, session_processes, summed_pss

ROOT = Path(__file__).parents[2]
BOUND_MB = 2500  # measured 1,832 MB at 10^4 clients (1,628 at 10^3, 2,594 at 10^5 with 10x the data)


def _sleeper(array_mb: int) -> subprocess.Popen:
    """A quiet child holding `array_mb` MB of touched private memory, so its PSS stays put while measured."""
    code = (f"import numpy, time; a = numpy.ones({array_mb} * 2**20 // 8); a += 1;"
            " print('ready', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    return child


def test_summed_pss_counts_a_childs_private_memory():
    # Two quiet children, so neither measurement depends on this (busy, garbage-collecting) test process.
    big, small = _sleeper(200), _sleeper(0)
    try:
        both, alive = summed_pss([psutil.Process(small.pid), psutil.Process(big.pid)])
        (one, _), (other, _) = summed_pss([psutil.Process(small.pid)]), summed_pss([psutil.Process(big.pid)])
        assert alive == 2 and other > 190 * 2**20  # the big child's 200 MB array
        assert abs(both - (one + other)) < 4 * 2**20  # a sum of both, not the largest or the first
        me = psutil.Process()
        alone, _ = summed_pss([me])
        with PeakMemory(lambda: session_processes("no-such-session-dir"), interval=0.05) as mem:
            buf = np.ones(300 * 2**20 // 8)
        assert mem.peak >= alone + 200 * 2**20 and buf[0] == 1  # the driver itself, growing while sampled
    finally:
        for child in (big, small):
            child.kill()
            child.wait()


@pytest.mark.slow  # long; run with -m slow
def test_ten_thousand_clients_stay_under_the_memory_bound(tmp_path):
    out = tmp_path / "scale.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--clients", "10000", "--rounds", "2",
                    "--json", str(out), "--out", str(tmp_path)], check=True, capture_output=True, timeout=600, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    (m,) = json.loads(out.read_text())
    assert m["clients"] == 10000 and m["per_round"] == 1000
    assert 500 < m["peak_pss_mb"] < BOUND_MB, m
    assert "| 10,000 | 1,000 |" in (tmp_path / "scale.md").read_text()
