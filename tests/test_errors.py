"""Every mistake a user can make on the command line: one line on stderr, exit status 2, no results
directory left behind; the traceback only with --debug. Cases run the CLI's `main` in this process
(fast); one case runs the installed entry point in a subprocess."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raysim.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "configs/fedavg/quickstart.yaml")
SWEEP = str(ROOT / "configs/fedavg/sweep_fedprox_mu.yaml")
FISHER = str(ROOT / "configs/fedfisher/fedfisher_digits.yaml")
ATTACK = str(ROOT / "configs/sketching/sketch_attack.yaml")
WRITERS = ("run", "sweep", "oneshot", "schedules", "compare", "rank", "attack")  # commands that take --out DIR


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
        "bad_attack.yaml": Path(ATTACK).read_text().replace("trials: 20", "trials: -1"),
        "duplicate.yaml": DUPLICATE,
        "shadow.py": "from raysim.data import register_source\n\n\n@register_source('digits')\n"
                     "def digits(cfg, seed):\n    raise AssertionError('never loaded')\n",
        "exits.py": "import sys\n\nsys.exit(3)\n",
        "infsource.py": "import numpy as np\nfrom raysim.data import Source, register_source\n\n\n"
                        "@register_source('inf_blobs')\ndef inf_blobs(cfg, seed):\n"
                        "    x = np.ones((100, 4), np.float32)\n    x[42, 2] = np.inf\n"
                        "    return Source(x, np.arange(100) % 2, (4,), 2)\n",
    }.items():
        (tmp_path / name).write_text(text)
        f[name] = str(tmp_path / name)
    (tmp_path / "latin1.yaml").write_bytes("name: caf\xe9\ndata: {source: digits, num_clients: 10}\n".encode("latin-1"))
    f["latin1.yaml"] = str(tmp_path / "latin1.yaml")
    pq.write_table(pa.table({"feature": [0.1, 0.2], "target": [0, 1]}), tmp_path / "nolabel.parquet")
    f["nolabel.parquet"] = str(tmp_path / "nolabel.parquet")
    pq.write_table(pa.table({"f": pa.array([], pa.float64()), "label": pa.array([], pa.int64())}), tmp_path / "empty.parquet")
    f["empty.parquet"] = str(tmp_path / "empty.parquet")
    values = np.linspace(0, 1, 40)
    values[7] = np.nan
    pq.write_table(pa.table({"f": values, "g": values[::-1], "label": np.arange(40) % 2}), tmp_path / "nan.parquet")
    f["nan.parquet"] = str(tmp_path / "nan.parquet")
    (tmp_path / "duplicate_run").mkdir()
    (tmp_path / "duplicate_run" / "config.yaml").write_text(DUPLICATE)
    f["duplicate_run"] = str(tmp_path / "duplicate_run")
    (tmp_path / "damaged_run").mkdir()
    pq.write_table(pa.table({"round": [1, 2], "sim_time": [1.0, 2.0]}), tmp_path / "damaged_run" / "rounds.parquet")
    whole = (tmp_path / "damaged_run" / "rounds.parquet").read_bytes()
    (tmp_path / "damaged_run" / "rounds.parquet").write_bytes(whole[:len(whole) // 2])  # a write cut off
    f["damaged_run"] = str(tmp_path / "damaged_run")
    (tmp_path / "not_a_run").mkdir()
    f["not_a_run"] = str(tmp_path / "not_a_run")
    (tmp_path / "no_images").mkdir()
    f["no_images"] = str(tmp_path / "no_images")
    f["missing"] = str(tmp_path / "missing")
    return f


PARQUET = ["data.source=parquet", "data.num_clients=2", "algorithm.clients_per_round=2"]
DUPLICATE = "name: twice\nalgorithm: {rounds: 2}\ndata: {source: digits, num_clients: 10}\nalgorithm: {rounds: 3}\n"

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
    ("Parquet file without rows", ["run", QUICK, *PARQUET, "data.path={empty.parquet}"],
     "data.path: {empty.parquet} has no rows"),
    ("NaN in a Parquet feature column", ["run", QUICK, *PARQUET, "backend=local", "data.path={nan.parquet}"],
     "column 'f' of {nan.parquet}: row 7 holds nan"),
    ("inf in a plugin source's features", ["run", QUICK, "backend=local", "data.source=inf_blobs", "data.num_clients=2",
                                           "algorithm.clients_per_round=2", "data.partition.kind=iid",
                                           "--plugin", "{infsource.py}"], "data.source: sample 42 has a NaN or infinite"),
    ("infinite learning rate", ["run", QUICK, "algorithm.lr=.inf"], "algorithm.lr: must be a finite number (got inf)"),
    ("infinite number in another section", ["run", QUICK, "system.compute.shift=.inf"],
     "system.compute.shift: must be a finite number"),
    ("boolean rounds", ["run", QUICK, "algorithm.rounds=true"], "algorithm.rounds: expected a number, not a boolean"),
    ("zero-width hidden layer", ["run", QUICK, "model.hidden=[0]"], "model.hidden.0: Input should be greater than"),
    ("duplicate key in the config", ["run", "{duplicate.yaml}"],
     "duplicate.yaml: not valid YAML: duplicate key 'algorithm', first at line 2; again at line 4"),
    ("duplicate key in a sweep's config", ["sweep", "{duplicate.yaml}"], "duplicate key 'algorithm', first at line 2"),
    ("duplicate key in a resumed run's config", ["run", "--resume", "{duplicate_run}"],
     "config.yaml: not valid YAML: duplicate key 'algorithm'"),
    ("config file not UTF-8", ["run", "{latin1.yaml}"], "latin1.yaml: not valid YAML: not UTF-8 text"),
    ("report of a damaged rounds.parquet", ["report", "{damaged_run}"], "{damaged_run}/rounds.parquet: damaged"),
    ("comparison with a damaged rounds.parquet", ["report", "{damaged_run}", "{damaged_run}"],
     "{damaged_run}/rounds.parquet: damaged"),
    ("--plugin taking a built-in's name", ["run", QUICK, "--plugin", "{shadow.py}"],
     "source 'digits' is already registered by module raysim.data.sources"),
    ("--plugin calling sys.exit", ["run", QUICK, "--plugin", "{exits.py}"], "exits.py': importing it called sys.exit(3)"),
    ("a CNN on data without an image shape", ["run", QUICK, "backend=local", "data.source=synthetic", "model.name=cnn"],
     "model.name: 'cnn' needs a data source with an image shape"),
    ("the logistic loss on 10 classes", ["run", QUICK, "backend=local", "algorithm.loss=bce"],
     "algorithm.loss: 'bce' is the logistic loss (66) of one output"),
    ("cross-entropy on real targets", ["run", str(ROOT / "configs/fedlrgd/fedlrgd_vs_fedavg_ridge_fedavg.yaml"),
                                      "backend=local", "algorithm.loss=ce"], "algorithm.loss: 'ce' needs class labels"),
    ("sketching with partial participation", ["run", str(ROOT / "configs/sketching/sketch_convergence.yaml"),
                                             "backend=local", "algorithm.clients_per_round=2"],
     "algorithm.clients_per_round: IterativeSketchingFL is full participation"),
    ("a constructor's plain ValueError", ["run", QUICK, "backend=local", "algorithm.name=scaffold",
                                          "algorithm.local_optimizer={kind: adam}"],
     "algorithm: scaffold's option II control variate assumes plain local SGD"),
    ("sweep space on an unknown field", ["sweep", SWEEP, "sweep.space={algorithm.muu: {grid: [0.0, 0.1, 1.0]}}"],
     "sweep.space.algorithm.muu: every value is invalid: algorithm.muu: unknown field"),
    ("a classifier on real targets", ["run", QUICK, "backend=local", "data.source=linear_regression",
                                      "data.partition={kind: iid}"], "model.name: 'mlp' has no parameters in 3.weight"),
    ("--address Ray cannot parse", ["run", QUICK, "--address", "no-such-address"],
     "--address no-such-address: cannot join Ray there (Invalid address format"),
    ("oneshot of a missing file", ["oneshot", "{missing}.yaml"], "config file '{missing}.yaml' does not exist"),
    ("oneshot with a field no method takes", ["oneshot", FISHER, "algorithm.nosuch=1"],
     "algorithm.nosuch: unknown field (no one-shot method takes it)"),
    ("oneshot --seeds not integers", ["oneshot", FISHER, "--seeds", "0,a"], "--seeds 0,a: 'a' is not an integer"),
    ("oneshot --methods unknown", ["oneshot", FISHER, "--methods", "fedavg,nosuch"], "--methods: unknown method 'nosuch'"),
    ("schedules of a missing file", ["schedules", "{missing}.yaml"], "config file '{missing}.yaml' does not exist"),
    ("schedules --sigma not numbers", ["schedules", str(ROOT / "configs/fedavg/fedbuff.yaml"), "--sigma", "1,x"],
     "--sigma 1,x: 'x' is not a number"),
    ("compare of a missing file", ["compare", "{missing}.yaml"], "config file '{missing}.yaml' does not exist"),
    ("rank of a missing file", ["rank", "{missing}.yaml"], "config file '{missing}.yaml' does not exist"),
    ("attack of a missing file", ["attack", "{missing}.yaml"], "config file '{missing}.yaml' does not exist"),
    ("attack with a wrong value", ["attack", "{bad_attack.yaml}"], "attack.trials: Input should be greater than"),
]


def fill(text: str, files: dict) -> str:
    for name, path in files.items():
        text = text.replace("{" + name + "}", path)
    return text


@pytest.mark.parametrize("args,named", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_exit_status_2(args, named, files, tmp_path, capsys):
    args = [fill(a, files) for a in args]
    out = tmp_path / "results" / "run"
    if args[0] in WRITERS and "--resume" not in args:
        args += ["--out", str(out)]
    status = main(args)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert fill(named, files) in lines[0], lines[0]
    assert not (tmp_path / "results").exists()


@pytest.mark.slow  # long; run with -m slow
def test_the_installed_command_answers_in_one_line_and_debug_shows_the_traceback(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    args = [sys.executable, "-m", "raysim.cli", "run", QUICK, "data.num_clients=5000", "--out", str(tmp_path / "r")]
    plain = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert plain.returncode == 2 and plain.stdout == ""
    assert plain.stderr.startswith("error: data.num_clients: 5000 clients") and len(plain.stderr.splitlines()) == 1
    assert not (tmp_path / "r").exists()
    debug = subprocess.run([*args, "--debug"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "DataError" in debug.stderr


@pytest.mark.slow  # long; run with -m slow
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
    ("report --out naming a file", None, ["report", "{run}", "--out", "{run}/config.yaml"],
     "--out {run}/config.yaml: exists and is not a directory"),
    ("retime --out naming a file", None, ["retime", "{run}", "--set", "system.comm.phi=5", "--out", "{run}/config.yaml"],
     "--out {run}/config.yaml: exists and is not a directory"),
    ("--resume with a truncated rounds.parquet", lambda run: _truncate(run / "rounds.parquet"),
     ["run", "--resume", "{run}"], "rounds.parquet: damaged, cannot be read ("),
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


def test_a_plugin_registering_a_lazily_loaded_built_in_name_is_refused(tmp_path):
    """The families load on a lookup that misses: a plugin's `fedavg`, registered before the fedavg family is
    imported, would have been what every lookup found. Its registration loads the built-ins first and is refused."""
    plugin = tmp_path / "early.py"
    plugin.write_text("from raysim import register_algorithm\nfrom raysim.training import LocalSGD\n\n\n"
                      "@register_algorithm('fedavg')\nclass Mine(LocalSGD):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "raysim.cli", "run", QUICK, "--plugin", str(plugin), "--out",
                           str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "algorithm 'fedavg' is already registered by module raysim.algorithms.fedavg" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_plugin_imported_again_or_installed_keeps_its_names_and_replace_takes_a_built_in_name(tmp_path, monkeypatch):
    """The same code registered again (a module reloaded, a snapshot installed in the driver's own process) is no
    conflict; another module's code under a taken name is refused; `replace=True` takes a built-in's name."""
    import importlib

    from raysim import plugins
    from raysim.data import register_partitioner
    from raysim.errors import PluginError

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "twice_plugin.py").write_text(
        "import numpy as np\nfrom raysim.data import register_partitioner\n\n\n"
        "@register_partitioner('twice_rr')\ndef round_robin(labels, num_clients, cfg, rng):\n"
        "    return np.arange(len(labels)) % num_clients\n")
    (tmp_path / "other_plugin.py").write_text(
        "from raysim.data import register_partitioner\n\n\n"
        "@register_partitioner('twice_rr')\ndef round_robin(labels, num_clients, cfg, rng):\n    return labels\n")
    builtin = plugins.PARTITIONERS["iid"]
    try:
        module = importlib.reload(importlib.import_module("twice_plugin"))
        plugins.install(plugins.snapshot())
        assert plugins.PARTITIONERS["twice_rr"] is module.round_robin
        with pytest.raises(PluginError, match="partitioner 'twice_rr' is already registered by module twice_plugin;"):
            plugins.load_plugin("other_plugin")
        register_partitioner("iid", replace=True)(module.round_robin)
        assert plugins.PARTITIONERS["iid"] is module.round_robin
    finally:
        plugins.PARTITIONERS["iid"] = builtin
        plugins.PARTITIONERS.pop("twice_rr", None)


def test_a_run_whose_first_round_says_it_would_take_over_a_day_warns_once(tmp_path, caplog):
    """`algorithm.rounds: 1e12` is legal; after round 1 the remaining rounds at its pace (10^12 x some ms) are
    one WARNING line through the `raysim` logger, with or without progress output. The run stops after round 2."""
    import logging

    import raysim

    with caplog.at_level(logging.INFO, logger="raysim"):
        result = raysim.run(QUICK, {"algorithm.rounds": 1e12, "backend": "local", "data.num_clients": 10},
                            out=tmp_path / "r", on_round=lambda row: row["round"] < 2)
    assert len(result.rounds) == 2 and result.info["status"] == "stopped"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "999999999999 more rounds" in warnings[0], warnings
    assert "days; check algorithm.rounds=1000000000000" in warnings[0]
