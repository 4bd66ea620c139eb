"""What the CSV and TensorBoard writers take from a round's row: its finite real numbers but the round."""
import math

import numpy as np

from raysim.callbacks.writers import scalars


def test_scalars_are_the_finite_real_numbers_of_a_row():
    row = {"round": 3, "acc": np.float32(0.5), "calls": np.int64(7), "loss": 0.25, "diverged": math.inf,
           "missing": math.nan, "stopped": True, "phase": "train", "spectrum": 1 + 2j}
    assert scalars(row) == {"acc": 0.5, "calls": 7.0, "loss": 0.25}
