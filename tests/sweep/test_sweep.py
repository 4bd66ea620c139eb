"""Sweeps: the `sweep:` schema and its up-front checks, trial placement groups, and real Ray Tune
searches on the session's 2-CPU Ray (concurrent trials in their own placement groups, ASHA, repeats
over seeds, Optuna, and a sweep whose driver is killed and resumed)."""
import json
import pickle
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from raysim.cli import main
from raysim.config import ConfigError, load_config
from raysim.sweep.results import summary_table
from raysim.sweep.trial import trial_resources
from raysim.sweep.tune import base_tree, check_space, run_sweep, trial_budget

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "name": "tiny_sweep",
    "seed": 0,
    "data": {"source": "digits", "num_clients": 20, "partition": {"kind": "dirichlet", "alpha": 0.5}},
    "model": {"name": "mlp", "hidden": [16]},
    "algorithm": {"name": "fedprox", "rounds": 3, "clients_per_round": 10, "lr": 0.5, "local_steps": 10,
                  "batch_size": 10, "mu": 0.01},
    "sweep": {"space": {"algorithm.mu": {"grid": [0.0, 0.01, 0.1, 1.0]}}, "concurrency": 2},
}


def with_sweep(**sweep):
    return {**TINY, "sweep": {**TINY["sweep"], **sweep}}


def space_error(space, *fragments):
    with pytest.raises(ConfigError) as err:
        check_space(load_config(with_sweep(space=space)))
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


@pytest.mark.parametrize("domain,fragment", [
    ({"grid": [1], "choice": [2]}, "exactly one of grid, choice, uniform, loguniform"),
    ({}, "exactly one of"),
    ({"uniform": [1.0, 0.5]}, "low must be below high"),
    ({"loguniform": [0.0, 1.0]}, "low must be > 0"),
    ({"randint": [1, 3]}, "randint: unknown field"),
])
def test_bad_domain_names_the_key(domain, fragment):
    with pytest.raises(ConfigError, match="sweep.space.algorithm.mu") as err:
        load_config(with_sweep(space={"algorithm.mu": domain}))
    assert fragment in str(err.value)


def test_space_values_checked_against_the_experiment_schema():
    space_error({"algorithm.muu": {"grid": [0.1]}}, "sweep.space.algorithm.muu: value 0.1",
                "algorithm.muu: unknown field")
    space_error({"algorithm.mu": {"grid": [0.1, -1]}}, "sweep.space.algorithm.mu: value -1",
                "greater than or equal to 0")
    space_error({"model.name": {"choice": ["mlp", "resnet"]}}, "sweep.space.model.name: value 'resnet'",
                "unknown model 'resnet'", "mlp")
    # a range over an integer field: its random draw is fractional and names the field
    space_error({"algorithm.local_steps": {"uniform": [1, 20]}}, "sweep.space.algorithm.local_steps",
                "valid integer")
    space_error({"sweep.metric": {"choice": ["test_loss"]}}, "sweep section itself cannot be searched")


def test_valid_space_yields_one_config_per_point():
    space = {"algorithm.mu": {"grid": [0.0, 0.1]}, "algorithm.lr": {"loguniform": [0.01, 1.0]}}
    cfg = load_config(with_sweep(space=space))
    points = check_space(cfg)
    assert [p.algorithm_params().mu for p in points[:2]] == [0.0, 0.1]
    lrs = [p.algorithm_params().lr for p in points[2:]]
    assert lrs[0] == 0.01 and lrs[2] == 1.0 and 0.01 < lrs[1] < 1.0
    assert "sweep" not in base_tree(cfg)


def test_run_ignores_the_sweep_section_and_example_validates():
    cfg = load_config(ROOT / "configs" / "fedavg" / "sweep_fedprox_mu.yaml")
    assert cfg.sweep.scheduler.kind == "asha" and list(cfg.sweep.space) == ["algorithm.mu"]
    assert len(check_space(cfg)) == 5
    assert load_config(TINY).algorithm_params().mu == 0.01


@pytest.mark.parametrize("cluster,cpus,actors", [
    ({}, 1.0, 1), ({}, 2.0, 2), ({"num_actors": 3}, 1.0, 3), ({"clients_per_actor": 5}, 1.5, 4),
    ({"cpus_per_actor": 0.25}, 1.0, 1),
])
def test_trial_bundles_fit_the_trial_budget(cluster, cpus, actors):
    cfg = load_config({**TINY, "cluster": cluster})
    res = trial_resources(cfg, cpus, 0.0)
    assert len(res.bundles) == 1 + actors and all(set(b) == {"CPU"} for b in res.bundles)
    assert sum(b["CPU"] for b in res.bundles) <= cpus + 1e-12 and res.bundles[0]["CPU"] > 0
    assert res.overrides["cluster.num_actors"] == actors
    assert all(b["CPU"] == res.overrides["cluster.cpus_per_actor"] for b in res.bundles[1:])
    # the trial's own config asks Server.start for exactly these actors
    assert load_config(cfg.model_dump(), res.overrides).actor_layout(64)[0] == actors


def test_trial_budget_errors_name_the_field():
    cfg = load_config(TINY)
    assert trial_budget(cfg.sweep, [cfg], {"CPU": 2.0}) == (1.0, 0.0)
    with pytest.raises(ConfigError, match="sweep.trial_cpus: 4 exceeds the cluster's 2 CPUs"):
        trial_budget(cfg.sweep.model_copy(update={"trial_cpus": 4.0}), [cfg], {"CPU": 2.0})
    with pytest.raises(ConfigError, match="sweep.trial_gpus"):
        trial_budget(cfg.sweep.model_copy(update={"trial_gpus": 0.5}), [cfg], {"CPU": 2.0})
    crowded = load_config({**TINY, "cluster": {"num_actors": 4, "cpus_per_actor": 0.5}})
    with pytest.raises(ConfigError, match="cluster.cpus_per_actor: 4 client actors x 0.5 CPUs exceed sweep.trial_cpus"):
        trial_budget(crowded.sweep, [crowded], {"CPU": 2.0})


def test_cli_refuses_a_bad_space_before_ray_starts(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(TINY))
    assert main(["sweep", str(path), "sweep.space={algorithm.mu: {grid: [-1]}}"]) == 2
    assert "sweep.space.algorithm.mu: value -1" in capsys.readouterr().err


@contextmanager
def within(seconds: int = 600):
    """Fail, instead of hanging, if trials starve each other for their actors."""
    def expire(*_):
        raise TimeoutError(f"the sweep did not finish within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def deadline():
    with within():
        yield


def trial_span(trial_dir: Path) -> tuple[float, float]:
    """(start, end) of a trial in seconds since the epoch, from Tune's own result.json."""
    reports = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    return reports[0]["timestamp"] - reports[0]["time_total_s"], reports[-1]["timestamp"]


@pytest.mark.slow  # long; run with -m slow
def test_four_trials_two_at_a_time_asha_stops_the_laggards_and_the_best_is_reported(ray_cluster, tmp_path, deadline):
    """4 trials x 3 rounds, 2 at a time on a 2-CPU Ray (each holds 1 CPU: server 0.5 + one client actor 0.5).
    The two tiny learning rates start only when a slot frees, after a good trial recorded round 1, and
    stay near the initial accuracy, so ASHA stops them at round 1 whatever order the first two report in."""
    sweep = with_sweep(space={"algorithm.lr": {"grid": [0.5, 0.3, 1e-6, 1e-7]}},
                       scheduler={"kind": "asha", "grace_period": 1, "reduction_factor": 2})
    result = run_sweep(sweep, out=tmp_path / "sweep", verbose=0)
    trials = pd.read_parquet(tmp_path / "sweep" / "sweep_results.parquet")
    pd.testing.assert_frame_equal(trials, result.trials, check_dtype=False)
    assert sorted(trials["algorithm.lr"]) == [1e-7, 1e-6, 0.3, 0.5]
    for _, t in trials.iterrows():
        rounds = pd.read_parquet(Path(t["run_dir"]) / "rounds.parquet")
        assert list(rounds["round"]) == list(range(1, t["rounds_done"] + 1))
        assert t["test_accuracy"] == rounds["test_accuracy"].iloc[-1]
        assert t["best_test_accuracy"] == rounds["test_accuracy"].max()
        assert json.loads((Path(t["run_dir"]) / "run.json").read_text())["status"] == t["status"]
        assert Path(t["run_dir"]).parent == tmp_path / "sweep" / t["trial_id"]  # inside the trial's Tune directory
    by_lr = trials.set_index("algorithm.lr")
    laggards = by_lr.loc[[1e-6, 1e-7]]
    assert (laggards["status"] == "stopped").all() and (laggards["rounds_done"] == 1).all(), laggards
    good = by_lr.loc[[0.5, 0.3]]
    assert set(good["status"]) <= {"finished", "stopped"} and (good["status"] == "finished").any(), good
    assert (good.loc[good["status"] == "finished", "rounds_done"] == 3).all()
    assert result.best["test_accuracy"] == trials["test_accuracy"].max() > 0.4
    assert result.best["algorithm.lr"] in (0.5, 0.3) and result.best["status"] == "finished"
    # the first two trials ran at once: neither starved the other of its actors
    spans = sorted(trial_span(tmp_path / "sweep" / t) for t in trials["trial_id"])
    assert spans[1][0] < spans[0][1], spans
    console = Console(record=True, width=160)
    console.print(summary_table(result))
    text = console.export_text()
    assert f"best: {result.best['trial_id']}" in text and "algorithm.lr=" in text


@pytest.mark.parametrize("sweep,fragment", [
    ({"search": {"kind": "optuna"}}, "sweep.search: optuna proposes every value itself; sweep.space.algorithm.mu is a grid"),
    ({"seeds": 3, "scheduler": {"kind": "asha"}}, "sweep.seeds: scheduler asha stops single runs"),
    ({"seeds": 2, "space": {"seed": {"choice": [1, 2]}}}, "sweep.seeds: every configuration runs over seeds"),
    ({"search": {"kind": "tpe"}}, "sweep.search.kind: Input should be 'basic' or 'optuna'"),
])
def test_search_and_seeds_refused_in_one_line(sweep, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(with_sweep(**sweep))
    assert str(err.value).startswith(fragment) and "\n" not in str(err.value), str(err.value)


def test_optuna_without_its_extra_is_one_line_before_ray(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # what `import optuna` meets where the extra is not installed
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(with_sweep(space={"algorithm.mu": {"choice": [0.0, 0.1]}}, search={"kind": "optuna"})))
    assert main(["sweep", str(path)]) == 2
    assert capsys.readouterr().err.strip().endswith("sweep.search: kind optuna needs the optional extra: "
                                                    "pip install 'raysim-fl[optuna]'")


def test_resume_refuses_what_is_not_a_sweep(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(json.dumps(TINY))  # a run directory has no tuner.pkl
    for args, fragment in [(["--resume", tmp_path / "run"], "is not a raysim sweep directory"),
                           (["--resume", tmp_path / "nowhere"], "does not exist"),
                           ([tmp_path / "s.yaml", "--resume", tmp_path / "run"], "not both")]:
        assert main(["sweep", *map(str, args)]) == 2
        err = capsys.readouterr().err.strip()
        assert fragment in err and "\n" not in err, err


SEEDED = {**TINY, "backend": "local", "eval": {"every": 2},
          "algorithm": {**TINY["algorithm"], "rounds": 2},
          "sweep": {"space": {"algorithm.lr": {"grid": [0.5, 1e-6]}}, "seeds": 2, "concurrency": 2}}
DETERMINISTIC = ["algorithm.lr", "seed", "rounds_done", "status", "test_accuracy", "test_loss", "train_loss",
                 "sim_time", "best_test_accuracy"]


@pytest.fixture(scope="module")
def seeded_sweep(ray_cluster, tmp_path_factory):
    """2 learning rates x 2 seeds, 2 rounds evaluated at the second only, backend local in every trial."""
    with within():
        return run_sweep(SEEDED, out=tmp_path_factory.mktemp("seeded") / "sweep", verbose=0)


@pytest.mark.slow  # long; run with -m slow
def test_seeds_give_one_row_per_configuration_with_mean_and_std(seeded_sweep):
    result = seeded_sweep
    trials = pd.read_parquet(result.sweep_dir / "sweep_results.parquet")
    assert sorted(zip(trials["algorithm.lr"], trials["seed"])) == [(1e-6, 0), (1e-6, 1), (0.5, 0), (0.5, 1)]
    for _, t in trials.iterrows():  # each trial ran its own seed
        assert load_config(Path(t["run_dir"]) / "config.yaml").seed == t["seed"] and t["status"] == "finished"
    configs = pd.read_parquet(result.sweep_dir / "sweep_configs.parquet")
    pd.testing.assert_frame_equal(configs, result.configs, check_dtype=False)
    assert list(configs["algorithm.lr"]) == [0.5, 1e-6] or list(configs["algorithm.lr"]) == [1e-6, 0.5]
    by_lr = trials.groupby("algorithm.lr")
    for _, c in configs.iterrows():
        runs = by_lr.get_group(c["algorithm.lr"])
        assert c["seeds"] == 2 and c["failed"] == 0 and sorted(c["trial_ids"]) == sorted(runs["trial_id"])
        for col in ("test_accuracy", "train_loss", "sim_time", "rounds_done"):
            assert c[f"{col}_mean"] == pytest.approx(runs[col].mean(), rel=1e-12)
            assert c[f"{col}_std"] == pytest.approx(runs[col].std(ddof=1), rel=1e-12, abs=1e-15)
    good = configs.set_index("algorithm.lr").loc[0.5]
    assert good["test_accuracy_std"] > 0  # the seeds are different runs
    assert result.best["algorithm.lr"] == 0.5 and result.best["test_accuracy_mean"] == configs["test_accuracy_mean"].max()
    console = Console(record=True, width=160)
    console.print(summary_table(result))
    assert f"best: 2 seeds  algorithm.lr=0.5  ->  test_accuracy={good['test_accuracy_mean']:.4g} ± " \
           f"{good['test_accuracy_std']:.4g}" in console.export_text()


@pytest.mark.slow  # long; run with -m slow
def test_tune_sees_every_scalar_of_every_round(seeded_sweep):
    """Round 1 is not evaluated: Tune still gets its row, without the metric (item 1: Tune's loggers see
    what a run's callbacks see)."""
    for _, t in seeded_sweep.trials.iterrows():
        rounds = pd.read_parquet(Path(t["run_dir"]) / "rounds.parquet")
        reports = [json.loads(line) for line in (Path(t["run_dir"]).parent / "result.json").read_text().splitlines()]
        assert [r["round"] for r in reports] == [1, 2]
        for report, (_, row) in zip(reports, rounds.iterrows()):
            numbers = {k: float(v) for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                       and pd.notna(v) and k != "round"}
            assert {k: report[k] for k in numbers} == numbers
        assert "test_accuracy" not in reports[0] and "test_accuracy" in reports[1]


def test_optuna_sees_the_mean_over_seeds(ray_cluster, tmp_path, deadline):
    """An Optuna proposal x 2 seeds: the seeds share its values, and Optuna's study holds the proposal's
    mean test accuracy over its seeds, the number sweep_configs.parquet reports."""
    sweep = {**SEEDED, "eval": {"every": 1}, "algorithm": {**SEEDED["algorithm"], "rounds": 1},
             "sweep": {**SEEDED["sweep"], "space": {"algorithm.lr": {"loguniform": [0.05, 1.0]}},
                       "search": {"kind": "optuna"}}}
    result = run_sweep(sweep, out=tmp_path / "sweep", verbose=0)
    trials, [config] = result.trials, result.configs.to_dict("records")
    assert sorted(trials["seed"]) == [0, 1] and trials["algorithm.lr"].nunique() == 1 and config["seeds"] == 2
    assert trials["test_accuracy"].nunique() == 2  # two different runs
    [state] = (tmp_path / "sweep").glob("searcher-state-*.pkl")
    [told] = pickle.loads(state.read_bytes())["_ot_study"].trials
    assert told.params["algorithm.lr"] == config["algorithm.lr"] == trials["algorithm.lr"].iloc[0]
    assert told.value == pytest.approx(config["test_accuracy_mean"], rel=1e-12) == trials["test_accuracy"].mean()


@pytest.mark.slow  # long; run with -m slow
def test_a_killed_sweep_resumes_without_rerunning_finished_trials(seeded_sweep, ray_cluster, tmp_path, deadline):
    """The seeded sweep's driver (a `raysim sweep` process on this Ray) is SIGKILLed once a trial has
    finished; `raysim sweep --resume` keeps that trial's run untouched and ends with the same tables."""
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(json.dumps(SEEDED))
    sweep_dir = tmp_path / "sweep"
    log = tmp_path / "driver.log"
    with log.open("w") as stderr:
        driver = subprocess.Popen([sys.executable, "-m", "raysim.cli", "sweep", str(cfg), "--out", str(sweep_dir), "-q",
                                   "--address", ray_cluster.get_runtime_context().gcs_address],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr)

    def finished() -> set[Path]:
        return {p.parent for p in sweep_dir.glob("*/run/run.json") if json.loads(p.read_text())["status"] == "finished"}

    while not finished():
        assert driver.poll() is None, log.read_text()
        time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    done = finished()
    assert 1 <= len(done) < 4 and not (sweep_dir / "sweep_results.parquet").exists()
    def stamps() -> dict[Path, tuple[int, str]]:
        return {d: ((d / "rounds.parquet").stat().st_mtime_ns, (d / "run.json").read_text()) for d in done}

    before = stamps()
    assert main(["sweep", "--resume", str(sweep_dir), "-q"]) == 0
    assert stamps() == before  # not run again, nor resumed
    resumed = pd.read_parquet(sweep_dir / "sweep_results.parquet")
    assert {Path(d) for d in resumed["run_dir"]} >= set(done)
    for _, t in resumed.iterrows():  # Tune (and a searcher) got every trial's final metric, resumed or not
        tune_log = max(sweep_dir.glob(f"{t['trial_id']}*/result.json"), key=lambda p: p.stat().st_mtime_ns)
        last = json.loads(tune_log.read_text().splitlines()[-1])
        assert last["round"] == 2 and last["test_accuracy"] == t["test_accuracy"]

    def table(frame, columns):
        return frame[columns].sort_values(columns[:2]).reset_index(drop=True)

    pd.testing.assert_frame_equal(table(resumed, DETERMINISTIC), table(seeded_sweep.trials, DETERMINISTIC))
    stats = ["algorithm.lr", "seeds", *(f"{c}_{s}" for c in DETERMINISTIC[4:] for s in ("mean", "std"))]
    pd.testing.assert_frame_equal(table(pd.read_parquet(sweep_dir / "sweep_configs.parquet"), stats),
                                  table(seeded_sweep.configs, stats))


def test_an_asha_grace_period_longer_than_every_trial_is_one_line_before_ray(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(with_sweep(space={"algorithm.mu": {"choice": [0.0, 0.1]}},
                                          scheduler={"kind": "asha", "grace_period": 50})))
    assert main(["sweep", str(path), "--out", str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("sweep.scheduler.grace_period: 50 rounds before ASHA may stop a trial, but the longest trial"
                        " runs 3 (algorithm.rounds)") and "\n" not in err
    assert not (tmp_path / "sweep").exists()


def test_a_round_reports_the_metric_first_so_tunes_live_table_shows_it():
    """Tune's live table shows a result's first columns: the round, the sweep's metric, simulated time and Γ lead."""
    from raysim.sweep.trial import reported

    row = {"round": 3, "phase": "train", "clients": 10, "selected": 10, "dropped": 0, "gamma": 40.0, "sim_time": 9.5,
           "test_loss": 0.7, "test_accuracy": 0.8}
    assert list(reported(row, "test_accuracy"))[:4] == ["round", "test_accuracy", "sim_time", "gamma"]
    assert reported(row, "test_accuracy")["clients"] == 10 and "phase" not in reported(row, "test_accuracy")
    assert list(reported({**row, "test_accuracy": None}, "test_accuracy"))[:3] == ["round", "sim_time", "gamma"]
