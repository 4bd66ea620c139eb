"""The name raysim is published under on the package index (the import name stays `raysim`) and its version."""
from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "raysim-fl"


def installed_version() -> str:
    """The installed distribution's version; `unknown` when raysim is imported from a checkout it was not installed from."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
