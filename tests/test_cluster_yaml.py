"""cluster.yaml against Ray's own cluster-launcher schema, as `ray up` checks it."""
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from raysim.runner.ray_session import CLUSTER_CONFIG

CLUSTER = yaml.safe_load((Path(__file__).parents[1] / "cluster.yaml").read_text())


def head_system_config() -> dict:
    """The `--system-config` of the head's `ray start` in cluster.yaml."""
    start = next(c for c in CLUSTER["head_start_ray_commands"] if "ray start" in c)
    flags = [w for w in shlex.split(start) if w.startswith("--system-config=")]
    assert len(flags) == 1, start
    return json.loads(flags[0].split("=", 1)[1])


def test_cluster_yaml_validates_against_rays_schema():
    validate_config(prepare_config(CLUSTER))  # what `ray up` runs before it launches anything


def test_cluster_yaml_has_head_and_gpu_workers_and_installs_raysim_from_the_repo():
    types = CLUSTER["available_node_types"]
    assert CLUSTER["head_node_type"] in types
    gpu = [t for t, spec in types.items() if spec["max_workers"] > 0]
    assert gpu, "no worker node type"
    assert any(src == "." for src in CLUSTER["file_mounts"].values())  # the repo itself is mounted
    assert any("pip install" in cmd and "-e ~/raysim" in cmd for cmd in CLUSTER["setup_commands"])


def test_every_node_starts_ray_with_token_authentication_and_no_public_dashboard():
    starts = CLUSTER["head_start_ray_commands"] + CLUSTER["worker_start_ray_commands"]
    for cmd in (c for c in starts if "ray start" in c):
        assert "RAY_AUTH_MODE=token ray start" in cmd, cmd
        assert "--dashboard-host" not in cmd, cmd  # the dashboard stays on 127.0.0.1: reach it with `ray dashboard`
    mounts = CLUSTER["file_mounts"]
    assert mounts["/home/ubuntu/.ray/auth_token"] == "~/.ray/auth_token"  # the user's token, outside the repo


def test_the_head_sets_what_a_local_raysim_sets_for_every_node():
    """Workers at normal priority and replies inline up to 1 MiB on a `ray up` cluster too (the workers' nodes take
    the head's system config; tests/test_multinode.py checks that they do)."""
    assert head_system_config() == CLUSTER_CONFIG
    assert all("--system-config" not in c for c in CLUSTER["worker_start_ray_commands"])  # the head's only


def test_the_schema_check_is_real():
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config({**CLUSTER, "max_workers": "four"}))
