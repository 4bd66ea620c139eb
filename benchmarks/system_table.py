"""Simulated vs analytic vs paper mean round time of a Type A round (compute phase + burke comm).

Run: python benchmarks/system_table.py
"""
from __future__ import annotations

import math

import numpy as np

from raysim.core.rng import SERVER, stream
from raysim.system import burke_completions, compute_time
from raysim.system.analytic import expected_compute_phase, paper_phase_estimate

SETTINGS = [(1, 100, 1.0, 2.0), (5, 100, 10.0, 2.0), (10, 1000, 1.0, 1.25)]  # (b, k, phi, nu)
DRAWS = 10_000


def simulate(b: int, k: int, phi: float, seed: int = 0) -> np.ndarray:
    """DRAWS Type A round times: k clients of b calls each, then k unit uploads (burke mode)."""
    out = np.empty(DRAWS)
    for r in range(DRAWS):
        compute = compute_time(np.full(k, b), stream(seed, r, 0, "compute"), 1.0, 1.0).max()
        out[r] = compute + burke_completions(np.ones(k), phi, stream(seed, r, SERVER, "upload")).max()
    return out


def main() -> None:
    print(f"{'b':>3} {'k':>5} {'phi':>5} {'nu':>5} | {'simulated (± s.e.)':>20} | {'analytic':>9} | {'paper log k+2b':>14}")
    for b, k, phi, nu in SETTINGS:
        t = simulate(b, k, phi)
        sim = f"{t.mean():.3f} ± {t.std(ddof=1) / math.sqrt(DRAWS):.3f}"
        analytic = expected_compute_phase(b, k) + phi * k
        paper = paper_phase_estimate(b, k) + phi * k
        print(f"{b:>3} {k:>5} {phi:>5g} {nu:>5g} | {sim:>20} | {analytic:>9.3f} | {paper:>14.3f}")
    print("burke mode: the communication phase phi*Erlang(k, 1) does not depend on nu.")


if __name__ == "__main__":
    main()
