"""mypy on the package as installed (pyproject.toml [tool.mypy]): zero errors, and the public API typed
enough that a wrong use of it is an error. The checkout maps actors/ and algorithms/ into raysim, so the
check runs on a tree of symlinks laid out as the installed package, at a fixed place under pytest's cache
so that mypy's incremental cache beside it stays valid between runs."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tree(request, tmp_path_factory) -> Path:
    """A folder holding `raysim/` as installed: the runtime's entries, `actors` and `algorithms`, as symlinks."""
    cache = getattr(request.config, "cache", None)
    base = cache.mkdir("mypy") if cache is not None else tmp_path_factory.mktemp("mypy")
    pkg = base / "tree" / "raysim"
    pkg.mkdir(parents=True, exist_ok=True)
    wanted = {p.name: p for p in (ROOT / "raysim").iterdir() if p.name != "__pycache__"}
    wanted |= {"actors": ROOT / "actors", "algorithms": ROOT / "algorithms"}
    for link in pkg.iterdir():
        if link.name not in wanted or link.resolve() != wanted[link.name].resolve():
            link.unlink()
    for name, target in wanted.items():
        if not (pkg / name).is_symlink():
            (pkg / name).symlink_to(target)
    return pkg.parent


def _mypy(tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           "--cache-dir", str(tree.parent / "cache"), *args],
                          cwd=tree, capture_output=True, text=True, timeout=600)


def test_the_package_type_checks(tree):
    proc = _mypy(tree, "-p", "raysim")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "Success: no issues found" in proc.stdout


def test_a_wrong_use_of_the_public_api_is_an_error(tree):
    """raysim.run, RunResult, the contract and the registry are annotated: misuses are caught, not Any."""
    (tree / "misuse.py").write_text(textwrap.dedent("""\
        import raysim
        from raysim.contract import Algorithm, Context
        from raysim.plugins import ALGORITHMS, register_algorithm

        where: int = raysim.run("x.yaml", progress=True).run_dir
        raysim.run("x.yaml", on_round=lambda row, server: None)
        raysim.RunResult.load(3)
        Algorithm(Context(seed="0"))
        kind: int = ALGORITHMS.kind
        register_algorithm(3)
        """))
    proc = _mypy(tree, "misuse.py")
    lines = {int(line.split(":")[1]) for line in proc.stdout.splitlines() if line.startswith("misuse.py:")}
    assert lines == {5, 6, 7, 8, 9, 10}, proc.stdout  # one misuse a line
