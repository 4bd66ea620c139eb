"""FedFisher plots: the accuracy-by-method table and bar chart of a `raysim oneshot` comparison
(the FedFisher paper Table 2), and test accuracy by round of a few-shot run (Fig. 2)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from raysim.report import register_report, save_figure
from raysim.results import RunResult
from raysim.storage.atomic import write_text

ONESHOT_FAMILIES = {"oneshot_fedavg", "fisher_merge", "regmean", "fedfisher", "otfusion", "pfnm"}


def summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean and population std (np.std) of test accuracy in %, seeds, and costs; the
    client overhead over one-shot FedAvg's (Table 1) when it ran, in oracle calls (exact: identical client work
    reads identical) and in measured CPU seconds (what a machine pays; a few points of scheduling noise)."""
    g = table.groupby("method", sort=False)
    s = pd.DataFrame({
        "accuracy_mean": g["test_accuracy"].mean() * 100,
        "accuracy_std": g["test_accuracy"].std(ddof=0) * 100,
        "seeds": g["seed"].count(),
        "client_oracle_calls": g["client_oracle_calls"].mean(),
        "upload_bytes": g["upload_bytes"].mean(),
        "client_cpu_s": g["client_cpu_s"].mean(),
    })
    for column, overhead in (("client_oracle_calls", "oracle_overhead_pct"), ("client_cpu_s", "cpu_overhead_pct")):
        s[overhead] = (s[column] / s[column].get("fedavg", float("nan")) - 1) * 100
    return s


def write_comparison(table: pd.DataFrame, out: Path) -> list[Path]:
    """oneshot.md (accuracy ± std by method) and oneshot.png (bar chart with std error bars)."""
    s = summary(table)
    lines = ["| method | test accuracy (%) | seeds | client oracle calls | vs fedavg | upload bytes | client CPU s | "
             "vs fedavg |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {m} | {r.accuracy_mean:.2f} ± {r.accuracy_std:.2f} | {int(r.seeds)} | {r.client_oracle_calls:,.0f} | "
              f"{r.oracle_overhead_pct:+.1f}% | {r.upload_bytes:,.0f} | {r.client_cpu_s:.2f} | {r.cpu_overhead_pct:+.1f}% |"
              for m, r in s.iterrows()]
    md = Path(out) / "oneshot.md"
    write_text("\n".join(lines) + "\n", md)
    fig, ax = plt.subplots(figsize=(1.2 * len(s) + 2, 3.6))
    ax.bar(s.index, s["accuracy_mean"], yerr=s["accuracy_std"], capsize=4, color="tab:blue", alpha=0.8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(f"one-shot methods ({int(s['seeds'].max())} seeds)")
    ax.tick_params(axis="x", rotation=30)
    ax.grid(axis="y", alpha=0.3)
    png = save_figure(fig, Path(out) / "oneshot.png")
    return [md, png]


@register_report("fedfisher_rounds")
def plot_rounds(result: RunResult) -> list[Path]:
    """Test accuracy after each round of a few-shot (rounds > 1) one-shot-family run; [] otherwise."""
    rounds = result.rounds
    if result.config["algorithm"]["name"] not in ONESHOT_FAMILIES or len(rounds) < 2:
        return []
    fig, ax = plt.subplots(figsize=(5, 3.4))
    ax.plot(rounds["round"], rounds["test_accuracy"] * 100, marker="o")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    return [save_figure(fig, result.run_dir / "fewshot_accuracy.png")]
