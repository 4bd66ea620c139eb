"""A real two-node Ray cluster on this machine (`ray start --head` + `ray start --address`, each
node with its own custom resource), closed by token authentication as cluster.yaml closes one: an
experiment run with `--address` and the token puts client actors on both; without it, it is refused."""
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import yaml

from test_cluster_yaml import head_system_config

RAY = str(Path(sys.executable).parent / "ray")
SECURE = {"RAY_AUTH_MODE": "token"}  # with RAY_AUTH_TOKEN_PATH: the token file every node and the driver read
CFG = {
    "name": "two_nodes",
    "seed": 3,
    "data": {"source": "digits", "num_clients": 8},
    "model": {"name": "logreg"},
    "algorithm": {"name": "fedavg", "rounds": 2, "clients_per_round": 4, "lr": 0.1, "local_steps": 2, "batch_size": 8},
    "cluster": {"num_actors": 2},
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(temp_dir: str) -> None:
    """Stop only this cluster's processes (`ray stop` would stop every Ray on the machine)."""
    for p in psutil.process_iter(["cmdline"]):
        if any(temp_dir in arg for arg in p.info["cmdline"] or []):
            p.kill()


@pytest.fixture(scope="module")
def two_nodes():
    """(address, environment with the token) of a token-protected two-node cluster."""
    temp_dir = tempfile.mkdtemp(prefix="rs2n", dir="/tmp")  # short: Ray's socket paths have a length limit
    token = Path(temp_dir) / "auth_token"
    token.write_text(secrets.token_hex(32))  # made here, as `ray get-auth-token --generate` makes it on a laptop
    token.chmod(0o600)
    env = {**os.environ, **SECURE, "RAY_AUTH_TOKEN_PATH": str(token)}
    port = _free_port()
    common = ["--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}", "--include-dashboard=false",
                        '--resources={"head_node": 1}', f"--system-config={json.dumps(head_system_config())}", *common],
                       check=True, capture_output=True, env=env, timeout=120)
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", '--resources={"worker_node": 1}', *common],
                       check=True, capture_output=True, env=env, timeout=120)
        yield f"127.0.0.1:{port}", env
    finally:
        _stop(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow  # long; run with -m slow
def test_client_actors_run_on_both_nodes(two_nodes, tmp_path):
    address, env = two_nodes
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(CFG))
    run = subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(tmp_path / "cfg.yaml"), "--address", address,
                          "--out", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    nodes = subprocess.run([sys.executable, "-c", (
        "import json, ray; ray.init(address=%r, logging_level='ERROR');"
        "print(json.dumps({n['NodeID']: sorted(n['Resources']) for n in ray.nodes() if n['Alive']}))") % address],
        capture_output=True, text=True, timeout=120, check=True, env=env)
    resources = json.loads(nodes.stdout.strip().splitlines()[-1])
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    used = set(info["actor_nodes"])
    assert len(used) == 2 and used <= set(resources)
    custom = {r for n in used for r in resources[n]} & {"head_node", "worker_node"}
    assert custom == {"head_node", "worker_node"}
    assert info["status"] == "finished"


@pytest.mark.slow  # long; run with -m slow
def test_a_client_without_the_token_is_refused(two_nodes, tmp_path):
    """Without a token (none on this machine either) and with a wrong one: refused; with it: joined."""
    address, env = two_nodes
    bare = {k: v for k, v in env.items() if not k.startswith("RAY_AUTH")}
    bare.update(HOME=str(tmp_path), RAY_py_gcs_connect_timeout_s="5")  # no ~/.ray/auth_token; give up after 5 s
    tries = {"none": bare, "wrong": {**bare, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},
             "right": env}
    probes = {name: subprocess.Popen([sys.executable, "-c", "import ray; ray.init(address=%r); print('JOINED')" % address],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
              for name, e in tries.items()}
    out = {name: p.communicate(timeout=180) for name, p in probes.items()}
    assert probes["right"].returncode == 0 and "JOINED" in out["right"][0], out["right"][1][-2000:]
    for name in ("none", "wrong"):
        assert probes[name].returncode != 0 and "JOINED" not in out[name][0]
        assert "InvalidAuthToken" in out[name][1], out[name][1][-2000:]


@pytest.mark.slow  # long; run with -m slow
def test_the_heads_system_config_reaches_the_worker_node(two_nodes):
    """cluster.yaml's head settings (started with them, as `ray up` starts the head) hold for a task on the other
    node: it runs at normal priority, and its 500 KB result travels inline (no copy in any node's object store)."""
    address, env = two_nodes
    probe = subprocess.run([sys.executable, "-c", (
        "import json, os, numpy as np, ray; ray.init(address=%r, logging_level='ERROR')\n"
        "@ray.remote(resources={'worker_node': 1})\n"
        "def f(): return np.zeros(62_500), os.nice(0), ray.get_runtime_context().get_node_id()\n"
        "ref = f.remote(); _, nice, node = ray.get(ref)\n"
        "head = [n['NodeID'] for n in ray.nodes() if n['Alive'] and 'head_node' in n['Resources']]\n"
        "print(json.dumps({'nice': nice, 'on_head': node in head,"
        " 'stored': ray.experimental.get_object_locations([ref])[ref]['node_ids']}))") % address],
        capture_output=True, text=True, timeout=120, env=env)
    assert probe.returncode == 0, probe.stderr[-2000:]
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    assert seen == {"nice": 0, "on_head": False, "stored": []}
