"""Config validation: every error names its field and what is allowed, before Ray starts."""
from pathlib import Path

import pytest

from raysim.config import ConfigError, dump_config, load_config, parse_override, read_yaml

BASE = {
    "name": "t",
    "data": {"source": "digits", "num_clients": 10},
    "algorithm": {"name": "fedavg", "rounds": 2, "clients_per_round": 5, "lr": 0.1},
}


def bad(overrides, *fragments):
    with pytest.raises(ConfigError) as err:
        load_config(BASE, overrides)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)
    return str(err.value)


def test_valid_config_resolves_defaults():
    cfg = load_config(BASE)
    assert cfg.algorithm_params().lr == 0.1 and cfg.algorithm_params().local_steps == 10
    assert cfg.system.comm.mode == "burke" and cfg.system.clock.mode == "virtual"
    assert "local_steps: 10" in dump_config(cfg)


@pytest.mark.parametrize("overrides,fragments", [
    ({"colour": "red"}, ["colour: unknown field"]),
    ({"data.shuffle": True}, ["data.shuffle: unknown field"]),
    ({"algorithm.lrr": 0.1}, ["algorithm.lrr: unknown field"]),
    ({"algorithm.rounds": "ten"}, ["algorithm.rounds:", "valid integer", "'ten'"]),
    ({"algorithm.lr": -0.1}, ["algorithm.lr:", "greater than 0", "-0.1"]),
    ({"data.test_fraction": 1.5}, ["data.test_fraction:", "(0, 1)"]),
    ({"data.test_fraction": 0.0}, ["data.test_fraction:"]),
    ({"algorithm.clients_per_round": 11}, ["algorithm.clients_per_round:", "exceeds data.num_clients=10"]),
    ({"system.stragglers.over_select": 6}, ["algorithm.clients_per_round:", "+6 over-selected"]),
    ({"algorithm.name": "fedsgd"}, ["algorithm.name: unknown algorithm 'fedsgd'", "fedavg", "fedprox"]),
    ({"model.name": "resnet"}, ["model.name:", "unknown model 'resnet'", "mlp"]),
    ({"data.source": "imagenet"}, ["data.source:", "imagenet", "digits"]),
    ({"system.comm.mode": "explicit", "system.comm.nu": 1.0}, ["system.comm", "unstable", "nu > 1"]),
    ({"system.comm.phi": -1}, ["system.comm.phi:", "greater than or equal to 0"]),
    ({"cluster.gpu_fraction": 1.5}, ["cluster.gpu_fraction:", "less than or equal to 1"]),
    ({"algorithm.local_steps": 3, "algorithm.local_epochs": 1}, ["algorithm", "either local_steps or local_epochs"]),
    ({"cluster.driver_shard": True, "system.clock.mode": "real"}, ["cluster.driver_shard:", "clock.mode 'virtual'"]),
    ({"cluster.driver_shard": True, "faults": [{"round": 1, "actor": 0}]}, ["cluster.driver_shard:", "faults"]),
    ({"algorithm.lr": float("nan")}, ["algorithm.lr: must be a finite number (got nan)"]),
    ({"algorithm.lr": "inf"}, ["algorithm.lr: must be a finite number (got 'inf')"]),
    ({"data.synthetic_alpha": float("-inf")}, ["data.synthetic_alpha:"]),
    ({"algorithm.lr": True}, ["algorithm.lr: expected a number, not a boolean (got True)"]),
    ({"cluster.num_cpus": True}, ["cluster.num_cpus: expected a number, not a boolean (got True)"]),
    ({"model.hidden": [32, True]}, ["model.hidden.1: expected a number, not a boolean"]),
    ({"model.channels": [16, -1]}, ["model.channels.1:", "greater than or equal to 1"]),
])
def test_bad_config_names_the_field(overrides, fragments):
    bad(overrides, *fragments)


def test_booleans_stay_allowed_where_a_field_takes_them():
    cfg = load_config(BASE, {"algorithm.vectorize": False, "cluster.driver_shard": True})
    assert cfg.algorithm.vectorize is False and cfg.cluster.driver_shard is True


def test_a_key_given_twice_in_a_file_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: t\ndata:\n  source: digits\n  num_clients: 10\n  source: mnist1d\n")
    with pytest.raises(ConfigError, match=r"c\.yaml: not valid YAML: duplicate key 'source', first at line 3; again at line 5"):
        load_config(path)
    assert read_yaml("a: &b {x: 1, y: 2}\nc: {<<: *b, x: 3}\n")["c"] == {"x": 3, "y": 2}  # a merge may be overridden


def test_all_problems_reported_together():
    message = bad({"algorithm.lr": -1, "data.test_fraction": 2}, "algorithm.lr", "data.test_fraction")
    assert message.count("\n") >= 2


def test_overrides_parse_yaml_values():
    assert parse_override("algorithm.lr=0.5") == ("algorithm.lr", 0.5)
    assert parse_override("model.hidden=[32, 32]") == ("model.hidden", [32, 32])
    assert parse_override("cluster.address=null") == ("cluster.address", None)
    cfg = load_config(BASE, ["algorithm.lr=0.5", "model.hidden=[8]", "seed=3"])
    assert cfg.algorithm_params().lr == 0.5 and cfg.model.hidden == [8] and cfg.seed == 3
    with pytest.raises(ConfigError, match="expected key.sub=value"):
        load_config(BASE, ["algorithm.lr"])


def test_exponents_read_as_floats_where_yaml_1_1_reads_strings(tmp_path):
    """`1e-6` in a file or an override is a number even in an untyped field such as a sweep's grid."""
    path = tmp_path / "c.yaml"
    path.write_text("name: t\ndata: {source: digits, num_clients: 10}\nalgorithm: {name: fedavg, lr: 1e-3}\n"
                    "sweep: {space: {algorithm.lr: {grid: [1e-6, 2.5E2]}}}\n")
    assert load_config(path).sweep.space["algorithm.lr"].grid == [1e-6, 250.0]
    cfg = load_config(path, ["sweep.space={algorithm.lr: {choice: [1e-4, 1.5e+3]}}"])
    assert cfg.sweep.space["algorithm.lr"].choice == [1e-4, 1500.0] and cfg.algorithm_params().lr == 1e-3


def test_missing_file_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(tmp_path / "list.yaml")


def test_actor_layout():
    cfg = load_config(BASE)
    assert cfg.actor_layout(cpus=2) == (2, 5)
    assert load_config(BASE, {"cluster.clients_per_actor": 1}).actor_layout(cpus=2) == (10, 1)
    assert load_config(BASE, {"cluster.num_actors": 3}).actor_layout(cpus=2) == (3, 4)


def test_clients_per_actor_alone_decides_the_actors_over_a_files_num_actors():
    """`cluster.clients_per_actor=1` on a config whose file sets num_actors: one actor per client, not a refusal."""
    quickstart = Path(__file__).parents[2] / "configs" / "fedavg" / "quickstart.yaml"
    cfg = load_config(quickstart, ["cluster.clients_per_actor=1", "data.num_clients=6", "algorithm.clients_per_round=3"])
    assert cfg.cluster.num_actors == 2 and cfg.actor_layout(2) == (6, 1)


def test_every_bundled_experiment_config_validates():
    """Each experiment config under configs/ loads, DP-FedAvg's dp.yaml included; the attack command's file is that
    command's own (no experiment in it)."""
    files = sorted((Path(__file__).parents[2] / "configs").glob("*/*.yaml"))
    assert len(files) > 30
    for path in files:
        if read_yaml(path.read_text()).get("command") != "attack":
            load_config(path)
