"""`raysim report RUN1 RUN2 ...`: one figure per shared metric with the runs overlaid against round, simulated time and Γ."""
import numpy as np
import pytest

from raysim.cli import main
from raysim.report.compare import legend_labels, overlay_figure, run_labels, seed_groups, shared_metrics
from raysim.results import RunResult


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synthetic_run):
    """Three runs of different lengths and speeds; the third also logs `objective`."""
    root = tmp_path_factory.mktemp("runs")
    return [synthetic_run(root / "lr0.1", rounds=150, name="fedavg"),
            synthetic_run(root / "lr0.3", rounds=40, name="fedavg", speed=2.0, seed=1),
            synthetic_run(root / "fedprox-long", rounds=90, name="fedprox", speed=0.5, seed=2,
                          metrics=("test_accuracy", "test_loss", "objective"))]


def test_report_of_several_runs_writes_a_figure_per_shared_metric(runs, tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["report", *map(str, runs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == ["compare_test_accuracy.png", "compare_test_loss.png"]
    assert all(p.stat().st_size > 20_000 for p in out.iterdir())
    assert "skipped objective: only in fedprox-long" in printed
    assert not [p for run in runs for p in run.glob("*.png")]  # the single-run plots are `raysim report RUN`'s


def test_the_comparison_goes_to_report_in_the_working_directory_by_default(runs, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(runs[0]), str(runs[1]), "--metric", "test_loss"]) == 0
    assert [p.name for p in (tmp_path / "report").iterdir()] == ["compare_test_loss.png"]


def test_each_panel_draws_every_run_to_its_last_evaluated_round(runs):
    results = [RunResult.load(r) for r in runs]
    labels = run_labels(results)
    assert labels == ["fedavg (lr0.1)", "fedavg (lr0.3)", "fedprox-long"]
    fig = overlay_figure("test_loss", results, labels)
    for ax, x in zip(fig.axes, ("round", "sim_time", "gamma")):
        lines = ax.get_lines()
        assert [line.get_label() for line in lines] == labels
        for line, result in zip(lines, results):
            assert np.max(line.get_xdata()) == result.rounds[x].iloc[-1]
            assert np.array_equal(line.get_ydata(), result.rounds["test_loss"].dropna())
        assert ax.get_yscale() == "log"  # the loss spans two decades
    assert overlay_figure("test_accuracy", results, labels).axes[0].get_yscale() == "linear"


def test_metrics_in_only_some_runs_are_skipped_and_named(runs):
    results = [RunResult.load(r) for r in runs]
    shared, skipped = shared_metrics(results, run_labels(results))
    assert shared == ["test_accuracy", "test_loss"]
    assert skipped == {"objective": ["fedprox-long"]}


def test_runs_whose_directories_read_the_same_are_named_by_path(tmp_path, synthetic_run):
    runs = [synthetic_run(tmp_path / p / "run", rounds=12, name="fedavg") for p in ("seed0", "seed1")]
    assert run_labels([RunResult.load(r) for r in runs]) == [f"fedavg ({r})" for r in runs]


@pytest.mark.parametrize("args,named", [
    (["{run}", "{not_a_run}"], "not_a_run has no rounds.parquet"),
    (["{run}", "{other}"], "the runs share no metric column"),
    (["{run}", "{run}", "--metric", "objective"], "--metric objective"),
], ids=["a directory that is not a run", "no shared metric", "a metric not in every run"])
def test_a_bad_comparison_is_one_line_and_exit_status_2_with_nothing_written(args, named, runs, tmp_path, synthetic_run,
                                                                            capsys):
    paths = {"run": str(runs[0]), "not_a_run": str(tmp_path / "not_a_run"),
             "other": str(synthetic_run(tmp_path / "other", rounds=12, metrics=("objective",)))}
    (tmp_path / "not_a_run").mkdir()
    out = tmp_path / "cmp"
    assert main(["report", *[paths.get(a.strip("{}"), a) for a in args], "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err
    assert not out.exists()


def test_runs_that_differ_in_their_config_are_named_by_the_values(tmp_path):
    """Two runs (e.g. a sweep's trials, in directories named by Tune) read by the config values that differ."""
    import raysim

    base = {"name": "labels", "backend": "local", "data": {"source": "digits", "num_clients": 10},
            "model": {"name": "logreg"}, "algorithm": {"name": "fedavg", "rounds": 2, "clients_per_round": 3, "lr": 0.1}}
    a = raysim.run(base, out=tmp_path / "trial_a1", progress=False)
    b = raysim.run(base, {"algorithm.lr": 0.3, "seed": 1}, out=tmp_path / "trial_b2", progress=False)
    assert legend_labels([a, b]) == ["algorithm.lr=0.1, seed=0", "algorithm.lr=0.3, seed=1"]
    assert run_labels([a, b]) == ["labels (trial_a1)", "labels (trial_b2)"]  # what messages name them by


def test_a_sweep_directory_is_reported_with_its_seeds_as_bands(tmp_path, synthetic_run):
    """`raysim report SWEEP`: the trials that wrote a run, overlaid in SWEEP/report, each configuration's seeds as one
    mean ± std band named by its values."""
    import pandas as pd
    import yaml

    sweep, dirs = tmp_path / "sweep", []
    for i, (lr, seed) in enumerate([(0.1, 0), (0.1, 1), (0.3, 0), (0.3, 1)]):
        run_dir = synthetic_run(sweep / f"trial_{i}" / "run", rounds=20, name="swept", seed=i)
        (run_dir / "config.yaml").write_text(yaml.safe_dump({"name": "swept", "seed": seed,
                                                             "algorithm": {"name": "fedavg", "lr": lr}}))
        dirs.append(run_dir)
    pd.DataFrame({"trial_id": [d.parent.name for d in dirs], "run_dir": [str(d) for d in dirs]}).to_parquet(
        sweep / "sweep_results.parquet")
    assert main(["report", str(sweep)]) == 0
    assert sorted(p.name for p in (sweep / "report").iterdir()) == ["compare_test_accuracy.png", "compare_test_loss.png"]
    groups = seed_groups([RunResult.load(d) for d in dirs])
    assert [(label, len(runs)) for label, runs in groups] == [("algorithm.lr=0.1", 2), ("algorithm.lr=0.3", 2)]
    fig = overlay_figure("test_loss", [], [], groups)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["algorithm.lr=0.1 (mean ± std of 2)", "algorithm.lr=0.3 (mean ± std of 2)"]
    both = [RunResult.load(d).rounds.set_index("round")["test_loss"] for d in dirs[:2]]
    np.testing.assert_allclose(lines[0].get_ydata(), ((both[0] + both[1]) / 2).dropna().to_numpy())
