"""Every mistake a user can make on the command line: one line on stderr, exit status 2, no results
directory left behind; the traceback only with --debug. Cases run the CLI's `main` in this process
(fast); one case runs the installed entry point in a subprocess."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raysim.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "configs/fedavg/quickstart.yaml")
SWEEP = str(ROOT / "configs/fedavg/sweep_fedprox_mu.yaml")


@pytest.fixture
def files(tmp_path):
    """The bad inputs on disk, by name."""
    f = {}
    for name, text in {
        "yaml_syntax.yaml": "data: [1, 2\nmodel: {",
        "empty.yaml": "",
        "a_list.yaml": "- data\n- model\n",
        "colour.yaml": Path(QUICK).read_text() + "colour: red\n",
        "plugins.yaml": Path(QUICK).read_text() + "plugins: [no_such_plugin_mod]\n",
        "bad_space.yaml": Path(SWEEP).read_text().replace("{grid: [0.0, 0.001, 0.01, 0.1, 1.0]}", "{grid: 3}"),
        "badplugin.py": "import no_such_dependency_xyz\n",
        "synplugin.py": "def broken(:\n",
        "corrupt.parquet": "this is not parquet",
    }.items():
        (tmp_path / name).write_text(text)
        f[name] = str(tmp_path / name)
    pq.write_table(pa.table({"feature": [0.1, 0.2], "target": [0, 1]}), tmp_path / "nolabel.parquet")
    f["nolabel.parquet"] = str(tmp_path / "nolabel.parquet")
    (tmp_path / "not_a_run").mkdir()
    f["not_a_run"] = str(tmp_path / "not_a_run")
    (tmp_path / "no_images").mkdir()
    f["no_images"] = str(tmp_path / "no_images")
    f["missing"] = str(tmp_path / "missing")
    return f


PARQUET = ["data.source=parquet", "data.num_clients=2", "algorithm.clients_per_round=2"]

# (case, arguments with {name} for a file above, what the line must name); `run` cases get --out.
CASES = [
    ("config file missing", ["run", "{missing}"], "missing"),
    ("YAML syntax error", ["run", "{yaml_syntax.yaml}"], "yaml_syntax.yaml: not valid YAML"),
    ("empty config file", ["run", "{empty.yaml}"], "empty.yaml"),
    ("top level not a mapping", ["run", "{a_list.yaml}"], "a_list.yaml"),
    ("unknown section", ["run", "{colour.yaml}"], "colour: unknown field"),
    ("unknown algorithm", ["run", QUICK, "algorithm.name=fedsgd"], "algorithm.name"),
    ("Dirichlet alpha 0", ["run", QUICK, "data.partition.alpha=0"], "data.partition.alpha"),
    ("negative rounds", ["run", QUICK, "algorithm.rounds=-3"], "algorithm.rounds"),
    ("test fraction above 1", ["run", QUICK, "data.test_fraction=1.5"], "data.test_fraction"),
    ("unknown model", ["run", QUICK, "model.name=resnet999"], "model.name"),
    ("override without =", ["run", QUICK, "algorithm.lr"], "algorithm.lr"),
    ("override not YAML", ["run", QUICK, "algorithm.lr=[0.1"], "algorithm.lr"),
    ("too few rounds for the algorithm", ["run", str(ROOT / "configs/fedlrgd/fedlrgd_vs_fedavg_ridge_fedlrgd.yaml"),
                                          "algorithm.rounds=2"], "algorithm.rounds: FedLRGD needs at least"),
    ("more clients a round than clients", ["run", QUICK, "algorithm.clients_per_round=500"], "algorithm.clients_per_round"),
    ("real clock on the local backend", ["run", QUICK, "backend=local", "system.clock.mode=real"], "system.clock.mode"),
    ("options for a source without any", ["run", QUICK, "data.options={rank: 2}"], "data.options"),
    ("Parquet file missing", ["run", QUICK, *PARQUET, "data.path={missing}"], "data.path"),
    ("Parquet file corrupt", ["run", QUICK, *PARQUET, "data.path={corrupt.parquet}"], "corrupt.parquet"),
    ("Parquet without the label column", ["run", QUICK, *PARQUET, "data.path={nolabel.parquet}"], "data.label_column"),
    ("data too small for the partition", ["run", QUICK, "data.num_clients=5000", "algorithm.clients_per_round=5"],
     "data.num_clients"),
    ("dataset not on disk", ["run", QUICK, "data.source=fashion_mnist", "data.path={no_images}"], "data.path"),
    ("--resume of a directory that is not a run", ["run", "--resume", "{not_a_run}"], "not_a_run"),
    ("--resume of a missing directory", ["run", "--resume", "{missing}"], "--resume"),
    ("CONFIG and --resume together", ["run", QUICK, "--resume", "{not_a_run}"], "--resume"),
    ("--plugin file missing", ["run", QUICK, "--plugin", "{missing}.py"], "missing.py"),
    ("--plugin that fails to import", ["run", QUICK, "--plugin", "{badplugin.py}"], "no_such_dependency_xyz"),
    ("--plugin with a syntax error", ["run", QUICK, "--plugin", "{synplugin.py}"], "synplugin.py, line 1"),
    ("--plugin module missing", ["list", "--plugin", "no_such_plugin_mod"], "no_such_plugin_mod"),
    ("plugins: in the config missing", ["run", "{plugins.yaml}"], "no_such_plugin_mod"),
    ("sweep space not a list", ["sweep", "{bad_space.yaml}"], "sweep.space.algorithm.mu.grid"),
    ("sweep without a sweep section", ["sweep", QUICK], "sweep"),
    ("report of a directory that is not a run", ["report", "{not_a_run}"], "not_a_run"),
    ("retime of a directory that is not a run", ["retime", "{not_a_run}", "--set", "system.comm.nu=3"], "not_a_run"),
    ("callback of an unknown kind", ["run", QUICK, "callbacks=[{kind: slack}]"], "callbacks.0"),
    ("early stopping without a patience", ["run", QUICK, "callbacks=[{kind: early_stopping, metric: test_loss}]"],
     "callbacks.0.early_stopping.patience"),
]


def fill(text: str, files: dict) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize("args,named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_exit_status_2(args, named, files, tmp_path, capsys):
    args = [fill(a, files) for a in args]
    out = tmp_path / "results" / "run"
    if args[0] in ("run", "sweep") and "--resume" not in args:
        args += ["--out", str(out)]
    status = main(args)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 3 and "Traceback" not in err, err
    assert fill(named, files) in lines[0], lines[0]
    assert not (tmp_path / "results").exists()


def test_the_installed_command_answers_in_one_line_and_debug_shows_the_traceback(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "raysim.cli", "run", QUICK, "data.num_clients=5000", "--out", str(tmp_path / "r")]
    plain = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert plain.returncode == 2 and plain.stdout == ""
    assert plain.stderr.startswith("error: data.num_clients: 5000 clients") and len(plain.stderr.splitlines()) == 1
    assert not (tmp_path / "r").exists()
    debug = subprocess.run([*args, "--debug"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "DataError" in debug.stderr


def test_a_mistake_without_out_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    """Without --out a run goes to runs/<name>-<time>/: a data error removes it, and runs/ too when the run made it."""
    monkeypatch.chdir(tmp_path)
    assert main(["run", QUICK, "data.num_clients=5000"]) == 2
    assert not (tmp_path / "runs").exists()
    (tmp_path / "runs").mkdir()
    assert main(["run", QUICK, "data.num_clients=5000"]) == 2
    assert list((tmp_path / "runs").iterdir()) == [] and "data.num_clients" in capsys.readouterr().err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A short finished run on the local backend (checkpoints after rounds 2 and 4), to copy and damage."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(["run", QUICK, "backend=local", "algorithm.rounds=4", "checkpoint.every=2", "--out", str(out), "-q"]) == 0
    return out


def _snapshot(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _truncate(path):
    path.write_bytes(path.read_bytes()[:7])


RUN_DIR_CASES = [  # (case, what to do to a copy of the finished run, arguments with {run}, what the line must name)
    ("--out on a run", None, ["run", QUICK, "--out", "{run}"], "already holds a run: `--resume {run}` continues it"),
    ("--out naming a file", None, ["run", QUICK, "--out", "{run}/config.yaml"], "config.yaml: exists and is not a directory"),
    ("--out under a file", None, ["run", QUICK, "--out", "{run}/config.yaml/sub"], "config.yaml/sub: cannot create it"),
    ("--out on a non-empty directory that is no run", None, ["run", QUICK, "--out", "{run}/data"], "not empty and holds no raysim run"),
    ("--overwrite without --out", None, ["run", QUICK, "--overwrite"], "--overwrite replaces the run in --out DIR"),
    ("--resume with a truncated rounds.parquet", lambda run: _truncate(run / "rounds.parquet"),
     ["run", "--resume", "{run}"], "rounds.parquet is damaged (ArrowInvalid"),
    ("--resume with every checkpoint damaged", lambda run: [_truncate(p) for p in run.glob("checkpoints/round-*/server.pkl")],
     ["run", "--resume", "{run}"], "no intact checkpoint (round 4: server.pkl has 7 bytes"),
]


@pytest.mark.parametrize("damage,args,named", [c[1:] for c in RUN_DIR_CASES], ids=[c[0] for c in RUN_DIR_CASES])
def test_a_mistake_about_a_run_directory_is_one_line_and_changes_nothing(finished_run, tmp_path, capsys, damage, args, named):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    if damage is not None:
        damage(run)
    before = _snapshot(tmp_path)
    status = main([a.replace("{run}", str(run)) for a in args])
    err = capsys.readouterr().err
    assert status == 2, err
    assert len(err.strip().splitlines()) == 1 and named.replace("{run}", str(run)) in err, err
    assert _snapshot(tmp_path) == before
