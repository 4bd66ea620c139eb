"""The one-shot comparison table (algorithms/fedfisher/plots.py): Table 1's client overhead over FedAvg, exact in
oracle calls (identical client work reads identical whatever the CPU noise) and measured in CPU seconds."""
import pandas as pd
import pytest

from raysim.algorithms.fedfisher.plots import summary, write_comparison


def test_identical_client_work_reads_identical_overhead(tmp_path):
    table = pd.DataFrame({
        "method": ["fedavg", "fisher_merge", "fedfisher_diag", "fedavg", "fisher_merge", "fedfisher_diag"],
        "seed": [0, 0, 0, 1, 1, 1], "test_accuracy": [0.5, 0.7, 0.71, 0.6, 0.72, 0.69],
        "client_oracle_calls": [1000, 1100, 1100, 1000, 1100, 1100], "upload_bytes": [8, 16, 16, 8, 16, 16],
        "client_cpu_s": [10.0, 11.2, 10.5, 10.0, 11.2, 10.5]})
    s = summary(table)
    assert s.loc["fisher_merge", "oracle_overhead_pct"] == s.loc["fedfisher_diag", "oracle_overhead_pct"] == pytest.approx(10.0)
    assert s.loc["fisher_merge", "cpu_overhead_pct"] == pytest.approx(12.0)
    assert s.loc["fedavg", "accuracy_std"] == pytest.approx(5.0)  # population std (np.std)
    md = write_comparison(table, tmp_path)[0].read_text()
    assert "| fedfisher_diag | 70.00 ± 1.00 | 2 | 1,100 | +10.0% | 16 | 10.50 | +5.0% |" in md
