"""A clone of the project holds only the project: nothing a user reads (README, docs, help texts and docstrings in
the package and the families, configs, benchmarks) may point at the design notes or specs beside it."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = ("../shared", "DESIGN.md", "specs/")


def test_nothing_a_user_reads_points_outside_the_repository():
    read = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml", ROOT / "cluster.yaml",
            *(p for top in ("raysim", "algorithms", "actors", "configs", "benchmarks", "docs")
              for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".yml", ".txt", ".toml"))]
    assert len(read) > 100
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}" for p in read if p.exists()
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if any(o in line for o in OUTSIDE)]
    assert not hits, "\n".join(hits)
