"""Running an experiment: the driver that validates it, claims its run directory, builds the data, starts the
backend (Ray's server and client actors, or the local engine), drives the rounds and writes the results
(`driver`: `run`), the Ray session fitted to a simulation (`ray_session`), what the person watching sees
(`progress`), and SIGINT/SIGTERM stopping at a round's end (`interrupt`)."""
from raysim.runner.driver import ensure_ray, run

__all__ = ["ensure_ray", "run"]
