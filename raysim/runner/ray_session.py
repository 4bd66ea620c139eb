"""Starting or joining Ray for a run: one place that fits a local Ray to a simulation."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

import ray
from ray._private import node as ray_node
from ray._private import parameter as ray_parameter
from ray._private import services as ray_services
from ray._raylet import GcsClient  # type: ignore[attr-defined]  # (built in Cython; not in its stub)
from ray.job_config import JobConfig

AUTH_NOTICE = "ray._private.authentication.authentication_token_setup"  # the logger of the token notice
# Ray's processes connect to a local socket (the raylet to its object store, among others) with tries a
# second apart. The raylet's first try at its store often comes before the store listens, which
# cost a whole second in 2 of 5 starts measured; tries 10 ms apart give up after 30 s, as the raylet's
# own start-up deadline does.
QUICK_CONNECT = {"raylet_client_connect_timeout_milliseconds": 10, "raylet_client_num_connect_attempts": 3000}
# A shard's reply (a few partial sums of the model's size: ~100 KB for the peer benchmark's mlp) travels in
# the call's own response up to 1 MiB, instead of through the object store above Ray's 100 KiB, which took
# ~1.2 ms more a round (3.0 -> 1.9 ms from a shard's end to the result in the driver at 1,000 clients).
INLINE_REPLIES = {"max_direct_call_object_size": 1 << 20}
# What every raysim cluster's head sets, a local Ray (`start_local`) and one of `ray up cluster.yaml` alike (the
# other nodes take it from the head): workers at normal priority and replies inline up to 1 MiB.
CLUSTER_CONFIG = {"worker_niceness": 0, **INLINE_REPLIES}
REGISTERED_POLL_S = 0.01  # how often start-up asks the GCS whether the raylet has registered
REGISTERED_WAIT_S = 30.0  # Ray's own deadline for it
PACKAGE = Path(__file__).resolve().parents[1]  # the raysim this process imported (site-packages, or a checkout's raysim/)


def _shadows_raysim(directory: str) -> bool:
    """Whether `directory`, first on sys.path, would make `import raysim` load another raysim than this
    process's. A source checkout's root does when raysim is installed non-editably: its raysim/ folder lacks
    raysim.actors and raysim.algorithms, which pyproject.toml maps from the root's actors/ and algorithms/.
    A folder named raysim without __init__.py does not: an installed raysim outranks a namespace portion."""
    spec = PathFinder.find_spec("raysim", [directory])
    if spec is None or spec.origin is None:
        return False
    return Path(spec.origin).resolve().parent != PACKAGE


class WorkerPaths(JobConfig):
    """Ray's job config, less the driver's directories that would shadow this raysim on the workers.

    `ray.init` lists the driver's working directory and its script's directory in the job config
    (`_py_driver_sys_path`, in ray/_private/worker.py `connect`), and every worker of the job, on every node,
    inserts them at the front of its sys.path before it loads an actor or a task. Run from a checkout's root
    with raysim installed non-editably, the workers then imported the checkout's raysim/ instead of the
    driver's, and every client actor died on `No module named 'raysim.algorithms'`. Such a directory is left
    out as Ray serializes the config; one without a raysim of its own stays, so the workers still find a
    user's modules there. (Registered plugins do not need it: `plugins.snapshot` ships them by value.)
    """

    def _get_proto_job_config(self) -> Any:
        self._py_driver_sys_path = [p for p in self._py_driver_sys_path if not _shadows_raysim(p)]
        return super()._get_proto_job_config()


def _await_registration(get_node: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """Ray's `services.get_node`, called once the raylet has registered with the GCS. Ray's own lookup
    sleeps a whole second between tries, and the raylet registers ~1.3 s into a start: the driver then
    idled ~0.7 s, or 1.7 s once the raylet was late. Polling the GCS's node table every 10 ms first
    leaves it one try that finds the node."""

    def wait_then_get(gcs_address: str, node_id: str) -> Any:
        client = GcsClient(address=gcs_address)
        deadline = time.monotonic() + REGISTERED_WAIT_S
        while time.monotonic() < deadline:
            try:
                nodes = client.get_all_node_info(timeout=REGISTERED_WAIT_S)
            except Exception:  # noqa: BLE001 - a GCS that does not answer: Ray's own lookup retries and reports it
                break
            if any(n.hex() == node_id for n in nodes):
                break
            time.sleep(REGISTERED_POLL_S)
        return get_node(gcs_address, node_id)

    return wait_then_get


@contextlib.contextmanager
def _lean_head() -> Iterator[None]:
    """While a local Ray starts, leave out the two head daemons a one-machine simulation never calls: the
    autoscaler monitor (nothing to scale) and the API server (dashboard, jobs and state API; the dashboard
    is off anyway): about 120 MB of PSS and two Python start-ups on the cores the run needs. Ray has no
    public switch for either (`ray start --no-monitor` is hidden, the API server always starts), so this
    sets its node's parameters for the duration of the call; where a Ray release renames them, nothing changes.
    It also waits for the raylet without Ray's one-second sleeps (`_await_registration`)."""
    init, api = ray_parameter.RayParams.__init__, getattr(ray_node.Node, "start_api_server", None)
    get_node = ray_services.get_node

    def lean_params(self: ray_parameter.RayParams, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.no_monitor = True

    ray_parameter.RayParams.__init__ = lean_params  # type: ignore[method-assign]
    if api is not None:
        ray_node.Node.start_api_server = lambda self, **kwargs: None  # type: ignore[method-assign]
    ray_services.get_node = _await_registration(get_node)
    try:
        yield
    finally:
        ray_services.get_node = get_node
        ray_parameter.RayParams.__init__ = init  # type: ignore[method-assign]
        if api is not None:
            ray_node.Node.start_api_server = api  # type: ignore[method-assign]


def start_local(num_cpus: int | None = None) -> None:
    """Start Ray on this machine for a simulation.

    Token authentication is on, as Ray >= 2.52 makes it for a local cluster unless RAY_AUTH_MODE says
    otherwise (the token is ~/.ray/auth_token, made if missing); Ray's warning that it did so on every
    run is not shown. Workers keep normal priority: Ray lowers them to nice 15, which starves the actors
    that do a simulation's work whenever anything else runs. Local sockets are retried every 10 ms, not
    every second (QUICK_CONNECT), and replies up to 1 MiB skip the object store (INLINE_REPLIES). No
    dashboard, no autoscaler monitor and no API server (`_lean_head`), and no idle workers started ahead:
    the run starts the actors it needs (a prestarted worker per CPU would idle on beside the driver's own
    shard, ~45 MB each).
    """
    notice = logging.getLogger(AUTH_NOTICE)
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        with _lean_head():
            ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING, job_config=WorkerPaths(),
                     _system_config={**CLUSTER_CONFIG, "prestart_worker_first_driver": False, **QUICK_CONNECT})
    finally:
        notice.setLevel(level)


def ensure(address: str | None, num_cpus: int | None = None) -> bool:
    """Join Ray at `address`, or start a local one; nothing if this process is connected already.
    True if this call started or joined Ray (the caller then shuts it down). Either way the workers import
    the driver's raysim (`WorkerPaths`); through Ray Client (`ray://`) Ray adds no driver directory to them."""
    if ray.is_initialized():
        return False
    if address and address.startswith("ray://"):
        ray.init(address=address, logging_level=logging.WARNING)
    elif address:
        ray.init(address=address, logging_level=logging.WARNING, job_config=WorkerPaths())
    else:
        start_local(num_cpus)
    return True
