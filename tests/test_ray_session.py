"""The local Ray a run starts: fitted to one machine, without the head daemons a simulation never calls."""
import psutil
import ray

from raysim.memory import session_processes


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
