"""The final sweep table: short headers with their full names in the caption, and no cell cut on any terminal
(an 80-column one gets each row as wrapping `name=value` words)."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from raysim.sweep.results import SweepResult, best, config_rows, short_names, summary_table

KEYS = ["algorithm.lr", "algorithm.mu", "algorithm.local_steps"]


def _result(seeds: bool) -> SweepResult:
    """Six finished trials of a three-key FedProx sweep, as `collect` tabulates them."""
    rng = np.random.default_rng(0)
    trials = pd.DataFrame([{
        "trial_id": f"train_fn_3f2a1_{i:05d}", "status": "finished", "algorithm.lr": [0.1, 0.05, 0.01][i % 3],
        "algorithm.mu": [0.0, 0.01][i % 2], "algorithm.local_steps": 5, "seed": i // 3, "rounds_done": 50,
        "test_accuracy": float(rng.uniform(0.5, 0.9)), "best_test_accuracy": float(rng.uniform(0.5, 0.9)),
        "sim_time": float(rng.uniform(1000, 5000)), "error": None} for i in range(6)])
    if not seeds:
        return SweepResult(Path("/tmp/sweep-fedprox"), trials, KEYS, "test_accuracy", "max", None,
                           best(trials, "test_accuracy", "max"))
    configs = pd.DataFrame(config_rows(trials, KEYS))
    return SweepResult(Path("/tmp/sweep-fedprox"), trials, KEYS, "test_accuracy", "max", configs,
                       best(configs, "test_accuracy_mean", "max"))


def _render(result: SweepResult, width: int) -> str:
    console = Console(record=True, width=width)
    console.print(summary_table(result, console.width))
    return console.export_text()


@pytest.mark.parametrize("seeds", [False, True])
@pytest.mark.parametrize("width", [80, 200])
def test_no_header_or_number_is_cut_at_any_width(seeds, width):
    result = _result(seeds)
    text = _render(result, width)
    assert "…" not in text
    assert "lr: algorithm.lr, mu: algorithm.mu, local_steps: algorithm.local_steps" in " ".join(text.split())
    rows = result.configs if seeds else result.trials
    for _, row in rows.iterrows():  # every row's values whole: side by side in columns, or as words
        accuracy = row["test_accuracy_mean" if seeds else "test_accuracy"]
        assert f"{accuracy:.4g}" in text
        if width == 80:
            assert f"lr={row['algorithm.lr']:.4g}  mu={row['algorithm.mu']:.4g}  local_steps=5" in text
    if width == 200:
        assert all(f" {h} " in text.splitlines()[2] for h in ("lr", "mu", "local_steps", "rounds", "best", "sim_time"))


def test_short_names_are_the_shortest_distinct_trailing_parts():
    assert short_names(["algorithm.lr", "algorithm.mu", "seed"]) == {"algorithm.lr": "lr", "algorithm.mu": "mu",
                                                                      "seed": "seed"}
    assert short_names(["algorithm.lr", "algorithm.server.lr", "data.partition.alpha"]) == {
        "algorithm.lr": "algorithm.lr", "algorithm.server.lr": "server.lr", "data.partition.alpha": "alpha"}
