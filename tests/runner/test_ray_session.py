"""The local Ray a run starts: fitted to one machine, without the head daemons a simulation never calls."""
import base64
import json
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import ray

from raysim.core.memory import session_processes
from raysim.runner import ray_session

from conftest import object_store


def _daemons(session_dir: str) -> list[str]:
    """The command lines of the session's live processes (killed actors of earlier tests may linger as zombies)."""
    lines = []
    for p in session_processes(session_dir):
        try:
            lines.append(" ".join(p.cmdline()))
        except psutil.Error:
            continue
    return lines


def test_a_local_ray_has_no_autoscaler_monitor_and_no_api_server_but_forwards_actor_logs(ray_cluster):
    lines = _daemons(ray._private.worker._global_node.get_session_dir_path())
    assert any("gcs_server" in c for c in lines) and any("raylet" in c for c in lines)
    assert any("log_monitor.py" in c for c in lines)  # an actor's print still reaches the driver
    assert not [c for c in lines if "autoscaler/_private/monitor.py" in c or "dashboard/dashboard.py" in c]

    @ray.remote(num_cpus=0)
    def square(x: int) -> int:
        return x * x

    assert ray.get(square.remote(7)) == 49  # tasks and their objects need neither


def _system_config(session_dir: str) -> dict:
    """The session's system config: the GCS's --config_list (base64 JSON), which the raylet and workers fetch."""
    gcs = next(c for c in _daemons(session_dir) if "gcs_server " in c)
    encoded = next(a for a in gcs.split() if a.startswith("--config_list=")).split("=", 1)[1]
    return json.loads(base64.b64decode(encoded))


def test_a_local_ray_retries_its_local_sockets_every_10_ms_for_30_s(ray_cluster):
    config = _system_config(ray._private.worker._global_node.get_session_dir_path())
    assert config["raylet_client_connect_timeout_milliseconds"] == 10
    assert config["raylet_client_connect_timeout_milliseconds"] * config["raylet_client_num_connect_attempts"] == 30_000


def test_a_reply_under_1_mib_comes_back_in_the_call_not_through_the_object_store(ray_cluster):
    @ray.remote(num_cpus=0)
    class Shard:
        def reply(self, n: int) -> np.ndarray:
            return np.ones(n, dtype=np.float32)

    shard = Shard.remote()
    ray.get(shard.reply.remote(1))
    before = object_store()[1]
    ref = shard.reply.remote(250_000)  # 1 MB: ten times Ray's own limit of 100 KiB
    assert ray.get(ref).sum() == 250_000 and object_store()[1] <= before
    ray.kill(shard)


def test_start_up_asks_ray_for_the_node_once_it_has_registered(ray_cluster, monkeypatch):
    gcs = ray._private.worker._global_node.gcs_address
    node = ray.get_runtime_context().get_node_id()
    calls = []
    wait = ray_session._await_registration(lambda address, node_id: calls.append((address, node_id)) or "info")
    assert wait(gcs, node) == "info" and calls == [(gcs, node)]
    monkeypatch.setattr(ray_session, "REGISTERED_WAIT_S", 0.3)  # a node that never registers: Ray's own lookup decides
    begun = time.monotonic()
    assert wait(gcs, "ab" * 28) == "info" and calls[-1] == (gcs, "ab" * 28) and time.monotonic() - begun >= 0.3


# A driver script outside its working directory, as `raysim run` is (the script dir is the venv's bin/): it
# imports raysim from the install, and its actor reports the raysim its worker imported.
PROBE = """
import ray
import raysim
from raysim.runner import ray_session

ray_session.ensure(None, num_cpus=1)


@ray.remote(num_cpus=0)
class Probe:
    def where(self) -> str:
        import raysim.algorithms  # mapped from the root's algorithms/: a checkout's raysim/ has none
        return raysim.__file__


print(raysim.__file__)
print(ray.get(Probe.remote().where.remote()))
"""


@pytest.mark.slow  # long; run with -m slow
def test_actors_import_the_drivers_raysim_when_the_working_directory_holds_another(tmp_path):
    # As `raysim run` from a checkout's root with raysim installed non-editably: Ray puts the driver's working
    # directory first on every worker's sys.path, and the checkout's raysim/ there has no algorithms/ or actors/.
    # (In the editable test venv setuptools' finder still finds raysim.algorithms under the decoy; the file the
    # actor's raysim came from is what tells.)
    checkout, bin_dir = tmp_path / "checkout", tmp_path / "bin"
    (checkout / "raysim").mkdir(parents=True)
    (checkout / "raysim" / "__init__.py").write_text('"""A decoy: a raysim/ without actors/ or algorithms/."""\n')
    bin_dir.mkdir()
    (bin_dir / "probe.py").write_text(PROBE)
    proc = subprocess.run([sys.executable, str(bin_dir / "probe.py")], cwd=checkout, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    driver, actor = proc.stdout.split()[-2:]
    assert actor == driver == str(ray_session.PACKAGE / "__init__.py")
