"""A researcher's own plugin (the README's example, as printed: a source, a partitioner, a model and an
algorithm), written outside the package, runs everywhere the driver's registrations must reach: client actors (several clients
each, and one client per actor), Tune trials, and the CLI with --plugin."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from raysim import plugins
from raysim.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
RAYSIM = [sys.executable, "-m", "raysim.cli"]


def _readme_plugin() -> str:
    """The README's "Write your own plugin" example, exactly as printed there."""
    text = (ROOT / "README.md").read_text()
    start = text.index("```python\n# my_plugin.py\n") + len("```python\n")
    return text[start:text.index("```", start)]


PLUGIN = _readme_plugin()


def _config(**extra) -> dict:
    return {"name": "mine", "seed": 1,
            "data": {"source": "blobs", "num_clients": 6, "partition": {"kind": "round_robin"}},
            "model": {"name": "no_bias_linear"},
            "algorithm": {"name": "shrinking_fedavg", "rounds": 4, "clients_per_round": 4, "lr": 0.1,
                          "local_steps": 3, "shrink": 0.5},
            "cluster": {"num_actors": 2, "num_cpus": 2}, "eval": {"every": 1}, **extra}


@pytest.fixture
def plugin_dir(tmp_path):
    """The plugin in a folder of its own, outside the package and not on sys.path."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "my_plugin.py").write_text(PLUGIN)
    return folder


def _run(args, cwd, timeout=300):
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


@pytest.mark.slow  # long; run with -m slow
def test_driver_registrations_reach_the_actors_in_every_layout(ray_cluster, plugin_dir, tmp_path):
    """A driver script imports its plugin itself (no `plugins:` key) and joins the session's Ray: the server
    and every client actor still build the blobs data, the model and the algorithm; one client per actor
    gives the same numbers."""
    address = ray_cluster.get_runtime_context().gcs_address
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path.insert(0, {str(plugin_dir)!r})
        import my_plugin  # registers blobs, round_robin, no_bias_linear, shrinking_fedavg
        import raysim
        cfg = {_config(data={"source": "blobs", "num_clients": 4, "partition": {"kind": "round_robin"}})!r}
        a = raysim.run(cfg, out={str(tmp_path / "shards")!r}, address={address!r})
        b = raysim.run(cfg, {{"cluster.num_actors": None, "cluster.clients_per_actor": 1}}, out={str(tmp_path / "single")!r},
                       address={address!r})
        print(a.info["shards"], b.info["shards"])
    '''))
    proc = _run([sys.executable, str(script)], cwd=tmp_path)
    assert proc.stdout.split()[-2:] == ["2", "4"]
    a = pd.read_parquet(tmp_path / "shards" / "rounds.parquet")
    b = pd.read_parquet(tmp_path / "single" / "rounds.parquet")
    assert len(a) == 4 and a["test_accuracy"].iloc[-1] > 0.6
    for col in ("test_accuracy", "test_loss", "train_loss", "sim_time", "gamma"):
        assert a[col].tolist() == b[col].tolist()


@pytest.mark.slow  # long; run with -m slow
def test_cli_run_and_a_two_trial_sweep_with_the_plugin(ray_cluster, plugin_dir, tmp_path):
    """`raysim run --plugin FILE` (in one process: backend local), and `raysim sweep` on the session's Ray of
    a config naming the plugin file (`plugins:`): each Tune trial runs the experiment in its own process."""
    run_cfg = tmp_path / "run.yaml"
    run_cfg.write_text(yaml.safe_dump(_config()))
    _run([*RAYSIM, "run", str(run_cfg), "backend=local", "--plugin", str(plugin_dir / "my_plugin.py"),
          "--out", str(tmp_path / "cli"), "--quiet"], cwd=tmp_path)
    assert len(pd.read_parquet(tmp_path / "cli" / "rounds.parquet")) == 4

    sweep_cfg = plugin_dir / "sweep.yaml"  # `plugins: [my_plugin.py]` is found next to the config
    sweep_cfg.write_text(yaml.safe_dump(_config(
        plugins=["my_plugin.py"], command="sweep", backend="local",
        sweep={"space": {"algorithm.shrink": {"grid": [0.5, 1.0]}}, "metric": "test_accuracy", "mode": "max",
               "concurrency": 1})))
    _run([*RAYSIM, "sweep", str(sweep_cfg), "--out", str(tmp_path / "sweep"), "--quiet",
          "--address", ray_cluster.get_runtime_context().gcs_address], cwd=tmp_path)
    trials = pd.read_parquet(tmp_path / "sweep" / "sweep_results.parquet")
    assert sorted(trials["algorithm.shrink"]) == [0.5, 1.0] and set(trials["status"]) == {"finished"}


def test_plugin_errors_name_the_plugin(tmp_path):
    with pytest.raises(ConfigError, match=r"plugins: plugin '.*nowhere\.py': no such file"):
        load_config({**_config(), "plugins": [str(tmp_path / "nowhere.py")]})
    with pytest.raises(ConfigError, match=r"plugins: plugin 'no_such_module_xyz': no module"):
        load_config({**_config(), "plugins": ["no_such_module_xyz"]})
    proc = subprocess.run([*RAYSIM, "list", "--plugin", str(tmp_path / "nowhere.py")], capture_output=True, text=True)
    assert proc.returncode == 2 and "nowhere.py" in proc.stdout + proc.stderr


def test_the_config_names_its_plugin_and_validates_against_it(plugin_dir):
    cfg = load_config({**_config(), "plugins": [str(plugin_dir / "my_plugin.py")]})
    assert cfg.algorithm_params().shrink == 0.5
    assert {"blobs", "round_robin", "no_bias_linear", "shrinking_fedavg"} <= {
        *plugins.SOURCES, *plugins.PARTITIONERS, *plugins.MODELS, *plugins.ALGORITHMS}


def test_raysim_run_on_a_file_for_another_command_names_the_command():
    proc = subprocess.run([*RAYSIM, "run", "configs/sketching/sketch_attack.yaml"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    out = (proc.stdout + proc.stderr).strip()
    assert "raysim attack configs/sketching/sketch_attack.yaml" in out and len(out.splitlines()) <= 2
