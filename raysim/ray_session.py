"""Starting or joining Ray for a run: one place that fits a local Ray to a simulation."""
from __future__ import annotations

import logging

import ray

AUTH_NOTICE = "ray._private.authentication.authentication_token_setup"  # the logger of the token notice


def start_local(num_cpus: int | None = None) -> None:
    """Start Ray on this machine for a simulation.

    Token authentication is on, as Ray >= 2.52 makes it for a local cluster unless RAY_AUTH_MODE says
    otherwise (the token is ~/.ray/auth_token, made if missing); Ray's warning that it did so on every
    run is not shown. Workers keep normal priority: Ray lowers them to nice 15, which starves the actors
    that do a simulation's work whenever anything else runs. No dashboard.
    """
    notice = logging.getLogger(AUTH_NOTICE)
    level = notice.level
    notice.setLevel(logging.ERROR)
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False, logging_level=logging.WARNING,
                 _system_config={"worker_niceness": 0})
    finally:
        notice.setLevel(level)


def ensure(address: str | None, num_cpus: int | None = None) -> bool:
    """Join Ray at `address`, or start a local one; nothing if this process is connected already.
    True if this call started or joined Ray (the caller then shuts it down)."""
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
    else:
        start_local(num_cpus)
    return True
