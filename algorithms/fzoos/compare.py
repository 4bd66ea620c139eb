"""Run every zeroth-order algorithm of one task and put them on one figure (the FZooS paper Figs. 1, 4, 6).

    python -m raysim.algorithms.fzoos.compare configs/fzoos/fzoos_quadratic_c5.yaml \
        --algorithms fzoos,fedzo,zo_fedprox,zo_scaffold1,zo_scaffold2 --rounds 50 --out runs/fig1_c5

Each algorithm runs through the real runtime with the config's shared settings (objective, T, lr,
optimiser...) and its own defaults; FD baselines use the official code's orthonormal directions
unless the config sets them, scaled d/Q so that eq. (3) is unbiased (fd_scale).
`--rounds` counts communication rounds (FZooS and SCAFFOLD-I get two phases each). Writes
compare.png (value vs rounds and vs queries), compare_cosine.png when the config logs cosines, and
compare.md: F(x_R) at equal rounds and at equal queries (the largest total every algorithm reached),
and rounds/queries to the gap thresholds.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import ray
import yaml

import raysim
from raysim.algorithms.fzoos.plots import by_round, cosine_profile, plot_cosines, plot_curves, value_column
from raysim.plugins import ALGORITHMS
from raysim.runner import ray_session
from raysim.storage.atomic import write_text

RUNTIME_KEYS = ("rounds", "clients_per_round", "vectorize")
FAMILY_DEFAULTS = {"fd_directions": "orthonormal"}
THRESHOLDS = (0.5, 0.1, 0.02)


def algorithm_section(base: dict, name: str, rounds: int | None) -> dict:
    """The config's algorithm section for `name`: the keys its Params accepts, runtime keys, FD defaults."""
    cls = ALGORITHMS.lookup(name)
    fields = cls.Params.model_fields
    section = {k: v for k, v in base.items() if k in fields or k in RUNTIME_KEYS}
    section.update({k: v for k, v in FAMILY_DEFAULTS.items() if k in fields and k not in base})
    comm = rounds if rounds is not None else base["rounds"] // len(ALGORITHMS.lookup(base["name"]).phases)
    section.update(name=name, rounds=comm * len(cls.phases))
    return section


def value_at_queries(data: pd.DataFrame, col: str, budget: float) -> float:
    """The value of the last round whose cumulative queries are within `budget`."""
    within = data[data["oracle_calls"] <= budget]
    return float(within[col].iloc[-1]) if len(within) else float("nan")


def table(curves: dict[str, pd.DataFrame]) -> str:
    col, label = value_column(next(iter(curves.values())))
    data = {name: by_round(r) for name, r in curves.items()}
    last = min(int(d["zo_round"].max()) for d in data.values())
    budget = min(float(d["oracle_calls"].max()) for d in data.values())
    head = [f"| algorithm | {label} at round {last} | {label} at {budget:,.0f} queries | "
            + " | ".join(f"rounds / queries to gap {t}" for t in THRESHOLDS) + " |",
            "|---|---|---|" + "---|" * len(THRESHOLDS)]
    for name, d in data.items():
        reach = []
        for t in THRESHOLDS:
            hit = d[d[col] <= t] if col == "gap" else d.iloc[0:0]
            reach.append(f"{int(hit['zo_round'].iloc[0])} / {int(hit['oracle_calls'].iloc[0]):,}" if len(hit) else "–")
        at_round = float(d[d["zo_round"] == last][col].iloc[0])
        head.append(f"| {name} | {at_round:.4f} | {value_at_queries(d, col, budget):.4f} | " + " | ".join(reach) + " |")
    return "\n".join(head) + "\n"


def compare(config: Path, algorithms: list[str], out: Path, rounds: int | None, overrides: list[str]) -> Path:
    """Run each algorithm on `config`'s task; write the figure(s) and the markdown table under `out`."""
    tree = yaml.safe_load(Path(config).read_text())
    out.mkdir(parents=True, exist_ok=True)
    curves = {}
    started = ray_session.ensure(None)  # one local Ray for all runs (each run would otherwise start its own)
    try:
        for name in algorithms:
            cfg = {**tree, "name": f"{tree.get('name', 'zo')}-{name}",
                   "algorithm": algorithm_section(tree["algorithm"], name, rounds)}
            curves[name] = raysim.run(cfg, overrides, out=out / name).rounds
    finally:
        if started:
            ray.shutdown()
    plot_curves(curves, out / "compare.png", tree.get("name", str(config)))
    profiles = {n: p for n, p in ((n, cosine_profile(r)) for n, r in curves.items()) if p is not None}
    if profiles:
        plot_cosines(profiles, out / "compare_cosine.png")
    md = table(curves)
    if profiles:
        md += "\n| algorithm | cumulative mean cos at t = 1 / 5 / 10 / T |\n|---|---|\n" + "".join(
            f"| {n} | {' / '.join(f'{p[min(t, len(p)) - 1]:.3f}' for t in (1, 5, 10, len(p)))} |\n"
            for n, p in profiles.items())
    write_text(md, out / "compare.md")
    print(md)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--algorithms", default="fzoos,fedzo,zo_fedprox,zo_scaffold1,zo_scaffold2")
    parser.add_argument("--rounds", type=int, default=None, help="communication rounds (default: the config's)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides applied to every run")
    args = parser.parse_intermixed_args()
    out = args.out or Path("runs") / f"compare-{args.config.stem}"
    compare(args.config, [a.strip() for a in args.algorithms.split(",") if a.strip()], out, args.rounds, args.overrides)


if __name__ == "__main__":
    main()
