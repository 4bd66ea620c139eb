"""The import contracts (pyproject.toml [tool.importlinter]), checked with import-linter on the package
as installed: raysim's runtime, actors/ and algorithms/ laid out as the one `raysim` package they map to."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).parent / "lint-imports"


def _package(tmp: Path) -> Path:
    """A copy of the sources arranged as the installed package (actors/ and algorithms/ inside raysim/), since
    import-linter reads a package from one folder and the checkout maps two folders into it."""
    pkg = tmp / "raysim"
    shutil.copytree(ROOT / "raysim", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for sub in ("actors", "algorithms"):
        shutil.copytree(ROOT / sub, pkg / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp


def _lint(tree: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), str(ROOT / "pyproject.toml")], cwd=tree, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=120)


def test_the_import_contracts_hold(tmp_path):
    proc = _lint(_package(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "4 kept, 0 broken" in proc.stdout


SMUGGLED = [  # (importer, imported, the contract that import breaks)
    ("algorithms/sketching/sketch.py", "raysim.algorithms.kernel.kernels", "No paper family imports another"),
    ("raysim/runner/driver.py", "raysim.algorithms.fedavg", "The runtime's layers"),
    ("actors/client.py", "raysim.algorithms.fzoos.gp", "The runtime's layers"),
    ("raysim/round/engine.py", "raysim.actors.server", "The runtime's layers"),
    ("raysim/data/sources.py", "raysim.config", "The runtime's layers"),
    ("raysim/training/stacked.py", "ray", "The round and its training kernels import no Ray"),
    ("raysim/results/tables.py", "raysim.results.retime", "No import cycles"),
]


def test_a_forbidden_import_breaks_its_contract(tmp_path):
    """Each contract breaks when one import it forbids is smuggled in (one lint run over all of them)."""
    tree = _package(tmp_path)
    for importer, imported, _ in SMUGGLED:
        target = tree / "raysim" / importer.removeprefix("raysim/")
        target.write_text(target.read_text() + f"\n\ndef _smuggled():\n    import {imported}  # noqa: F401\n")
    proc = _lint(tree)
    assert proc.returncode != 0
    assert "0 kept, 4 broken" in proc.stdout, proc.stdout[-3000:]
    for importer, imported, contract in SMUGGLED:
        module = importer.removeprefix("raysim/").removesuffix(".py").replace("/", ".")
        within = f".{module.rsplit('.', 1)[-1]} -> .{imported.rsplit('.', 1)[-1]}"  # how the cycle contract names them
        assert f"raysim.{module} -> {imported}" in proc.stdout or within in proc.stdout, (module, imported)
        assert contract in proc.stdout


def test_a_new_top_level_module_must_take_its_place_in_the_layers(tmp_path):
    """The layers contract is exhaustive: a module added at raysim/'s top level, outside every subpackage, breaks
    it until it is given a layer, so the top holds only the public entry points."""
    tree = _package(tmp_path)
    (tree / "raysim" / "helpers.py").write_text('"""A stray module."""\n')
    proc = _lint(tree)
    assert proc.returncode != 0 and "raysim.helpers" in proc.stdout + proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_round_engine_and_the_local_backend_load_without_ray():
    code = "import sys, raysim.round.engine, raysim.round.local, raysim.round.shard, raysim.training; assert not any(m.split('.')[0] == 'ray' for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_import_raysim_and_its_cli_leave_the_heavy_optional_libraries_unloaded():
    """`import raysim` (and the CLI module behind `raysim --help` and a config error's one line) load none of scipy's
    special functions (0.16 s), Ray, pandas, matplotlib, gpytorch or numba: each is imported where a run first uses it."""
    heavy = ("scipy.special", "scipy.stats", "ray", "pandas", "matplotlib", "gpytorch", "numba")
    code = f"import sys, raysim, raysim.cli; loaded = [m for m in {heavy!r} if m in sys.modules]; assert not loaded, loaded"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_package_is_in_the_distribution():
    """Each folder of the installed `raysim` package (runtime, actors/, algorithms/) is listed in
    [tool.setuptools] packages, so the wheel holds it: a folder left out imports in the checkout and not installed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top, name in (("raysim", "raysim"), ("actors", "raysim.actors"), ("algorithms", "raysim.algorithms")):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(ROOT / top).parts]))
    assert found - listed == set()
