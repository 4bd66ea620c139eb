"""Hyperparameter sweeps on Ray Tune: validating the space and running or resuming a sweep (`tune`:
`run_sweep`), how trials are proposed (`search`), one trial and its placement group (`trial`), and the
sweep's tables (`results`). The `sweep:` section's schema lives with the experiment file (raysim.config)."""
from raysim.sweep.tune import run_sweep

__all__ = ["run_sweep"]
