"""A real two-node Ray cluster on this machine (`ray start --head` + `ray start --address`, each
node with its own custom resource): an experiment run with `--address` puts client actors on both."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
import yaml

RAY = str(Path(sys.executable).parent / "ray")
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled"}  # a token minted by the head would not reach the second node
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


@pytest.fixture
def two_nodes():
    temp_dir = tempfile.mkdtemp(prefix="rs2n", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = _free_port()
    common = ["--num-cpus=1", "--disable-usage-stats"]
    try:
        subprocess.run([RAY, "start", "--head", f"--port={port}", f"--temp-dir={temp_dir}", "--include-dashboard=false",
                        '--resources={"head_node": 1}', *common], check=True, capture_output=True, env=ENV, timeout=120)
        subprocess.run([RAY, "start", f"--address=127.0.0.1:{port}", '--resources={"worker_node": 1}', *common],
                       check=True, capture_output=True, env=ENV, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        _stop(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_client_actors_run_on_both_nodes(two_nodes, tmp_path):
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(CFG))
    run = subprocess.run([sys.executable, "-m", "raysim.cli", "run", str(tmp_path / "cfg.yaml"), "--address", two_nodes,
                          "--out", str(tmp_path / "run"), "--quiet"], capture_output=True, text=True, timeout=300, env=ENV)
    assert run.returncode == 0, run.stdout + run.stderr
    nodes = subprocess.run([sys.executable, "-c", (
        "import json, ray; ray.init(address=%r, logging_level='ERROR');"
        "print(json.dumps({n['NodeID']: sorted(n['Resources']) for n in ray.nodes() if n['Alive']}))") % two_nodes],
        capture_output=True, text=True, timeout=120, check=True, env=ENV)
    resources = json.loads(nodes.stdout.strip().splitlines()[-1])
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    used = set(info["actor_nodes"])
    assert len(used) == 2 and used <= set(resources)
    custom = {r for n in used for r in resources[n]} & {"head_node", "worker_node"}
    assert custom == {"head_node", "worker_node"}
    assert info["status"] == "finished"
