"""The installed distribution is raysim-fl (raysim on the package index is another project): its metadata, the
version raysim reports, the `raysim` command and the `raysim.plugins` entry points all come from it."""
import tomllib
from importlib import import_module, metadata
from pathlib import Path

import raysim
from raysim.core.distribution import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[2]


def test_metadata_names_the_distribution_and_raysim_reports_its_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dist = metadata.distribution(DISTRIBUTION)
    assert project["name"] == dist.metadata["Name"] == "raysim-fl"
    assert raysim.__version__ == dist.version == project["version"]


def test_command_and_plugins_come_from_the_distribution():
    dist = metadata.distribution(DISTRIBUTION)
    (script,) = [e for e in dist.entry_points if e.group == "console_scripts"]
    assert (script.name, script.value) == ("raysim", "raysim.cli:entry_point")
    plugins = {e.name: e for e in metadata.entry_points(group="raysim.plugins")}
    assert set(plugins) == {e.name for e in dist.entry_points if e.group == "raysim.plugins"}
    assert {"fedavg", "sketching"} <= set(plugins)
    for name, entry in plugins.items():
        assert entry.load() is import_module(f"raysim.algorithms.{name}")
