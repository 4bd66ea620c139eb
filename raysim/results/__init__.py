"""What a run leaves to read: the run directory and its tables, written as the rounds go and loaded back with
pandas (`tables`: `RunResult`), the trained model taken out of a checkpoint (`export`), and a finished run
re-timed under another system model from its recorded costs (`retime`)."""
from raysim.results.tables import HOST_COLUMNS, RunResult, RunWriter, new_run_dir, reproducible

__all__ = ["HOST_COLUMNS", "RunResult", "RunWriter", "new_run_dir", "reproducible"]
