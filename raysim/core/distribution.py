"""The name raysim is published under on the package index (the import name stays `raysim`) and its version."""
from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "raysim-fl"


def needs_extra(what: str, extra: str) -> str:
    """The one line that says `what` needs an optional extra, and the command that installs it."""
    return f"{what} needs the optional extra: pip install '{DISTRIBUTION}[{extra}]'"


def installed_version() -> str:
    """The installed distribution's version; `unknown` when raysim is imported from a checkout it was not installed from."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"
