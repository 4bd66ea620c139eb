"""Sweeps: the `sweep:` schema and its up-front checks, trial placement groups, and real Ray Tune
searches on the session's 2-CPU Ray (concurrent trials in their own placement groups, ASHA)."""
import json
import signal
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from raysim.cli import main
from raysim.config import ConfigError, load_config
from raysim.sweep import base_tree, check_space, run_sweep, summary_table, trial_budget, trial_resources

ROOT = Path(__file__).resolve().parents[1]
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


@pytest.fixture
def deadline():
    """Fail, instead of hanging, if trials starve each other for their actors."""
    def expire(*_):
        raise TimeoutError("the sweep did not finish within 600 s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(600)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def trial_span(trial_dir: Path) -> tuple[float, float]:
    """(start, end) of a trial in seconds since the epoch, from Tune's own result.json."""
    reports = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    return reports[0]["timestamp"] - reports[0]["time_total_s"], reports[-1]["timestamp"]


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
