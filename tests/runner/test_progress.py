"""Progress in logs (raysim/runner/progress.py): piped, a line every N rounds or every 10 s, whichever comes later, and
at the last round; the start-up phases; --quiet, --verbose and RAYSIM_LOG_LEVEL through the CLI."""
import logging

import pytest

from raysim.cli import main
from raysim.runner.progress import RunProgress, log_level

from conftest import STRAGGLERS


def logged_rounds(caplog, times, every_rounds, total=None):
    """The rounds that got a line when round r (1-based) ends at times[r - 1] seconds."""
    clock = iter([0.0, *times])
    with caplog.at_level(logging.INFO, logger="raysim"):
        caplog.clear()
        with RunProgress("p", total or len(times), 0, True, every_rounds=every_rounds, every_s=10.0,
                         interactive=False, clock=lambda: next(clock)) as bar:
            for r in range(1, len(times) + 1):
                bar.update({"round": r, "sim_time": float(r), "test_accuracy": 0.5})
    return [int(m.split("round ")[1].split("/")[0]) for m in caplog.messages]


def test_fast_rounds_print_every_10_seconds(caplog):
    """0.5 s rounds, N = 2: two rounds come long before 10 s, so the seconds decide (and the first and last round)."""
    assert logged_rounds(caplog, [0.5 * r for r in range(1, 61)], 2) == [1, 21, 41, 60]


def test_slow_rounds_print_every_n_rounds(caplog):
    """30 s rounds, N = 3: 10 s pass within each round, so every third round prints."""
    assert logged_rounds(caplog, [30.0 * r for r in range(1, 11)], 3) == [1, 4, 7, 10]


def test_line_has_the_round_metric_and_eta(caplog):
    logged_rounds(caplog, [10.0, 20.0, 30.0, 40.0], 1)
    assert caplog.messages[1] == "p: round 2/4  test_accuracy 0.5000  sim_time 2.0  elapsed 20 s  ETA 20 s"


@pytest.mark.parametrize("total,warned", [(1_000_000, True), (1_000, False)])
def test_a_first_round_that_says_the_run_would_take_over_a_day_warns_once(caplog, total, warned):
    """1 s a round: 10^6 rounds (11.6 days) warn once, even with progress off; 1000 rounds (17 minutes) do not."""
    clock = iter(float(t) for t in range(4))
    with caplog.at_level(logging.WARNING, logger="raysim"):
        with RunProgress("p", total, 0, False, interactive=False, clock=lambda: next(clock)) as bar:
            for r in (1, 2, 3):
                bar.update({"round": r, "sim_time": float(r)})
    expected = ["p: 999999 more rounds at 1 s a round would take about 11.6 days; check algorithm.rounds=1000000"]
    assert caplog.messages == (expected if warned else [])


def test_log_level_from_flags_and_environment(monkeypatch):
    assert (log_level(), log_level(verbose=True), log_level(quiet=True)) == (logging.INFO, logging.DEBUG, logging.WARNING)
    monkeypatch.setenv("RAYSIM_LOG_LEVEL", "debug")
    assert log_level(quiet=True) == logging.DEBUG


def cli_run(tmp_path, *flags):
    tiny = tmp_path / "tiny.yaml"
    import yaml

    tiny.write_text(yaml.safe_dump({**STRAGGLERS, "algorithm": {**STRAGGLERS["algorithm"], "rounds": 3},
                                    "backend": "local"}))
    return main(["run", str(tiny), "--out", str(tmp_path / "run"), *flags])


def test_piped_run_logs_its_phases_and_rounds(tmp_path, capsys):
    assert cli_run(tmp_path) == 0
    err = capsys.readouterr().err
    for line in ("stragglers: writing", "data: 12 clients", "actors: none", "round 1/3", "round 3/3"):
        assert line in err, err


@pytest.mark.parametrize("flags, env, shown", [(["--quiet"], None, False), (["-v"], None, True), (["--quiet"], "INFO", True)])
def test_quiet_verbose_and_the_environment(tmp_path, capsys, monkeypatch, flags, env, shown):
    if env:
        monkeypatch.setenv("RAYSIM_LOG_LEVEL", env)
    assert cli_run(tmp_path, *flags) == 0
    assert ("round 3/3" in capsys.readouterr().err) == shown


def test_a_bad_log_level_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RAYSIM_LOG_LEVEL", "LOUD")
    assert cli_run(tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RAYSIM_LOG_LEVEL='LOUD'" in err[0] and "INFO" in err[0]


def test_the_logger_follows_stderr_when_it_is_replaced(monkeypatch):
    """Configured once (by the CLI), the plain handler writes to the stderr of the moment, not a closed earlier one."""
    import io
    import sys

    from raysim.runner.progress import LOGGER, configure_logging

    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging()
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    LOGGER.info("after the swap")
    assert "raysim INFO after the swap" in second.getvalue()


SCRIPT = """
import raysim
cfg = {"name": "script", "backend": "local", "data": {"source": "digits", "num_clients": 6},
       "model": {"name": "logreg"}, "algorithm": {"name": "fedavg", "rounds": 3, "clients_per_round": 3}}
raysim.run(cfg, out=OUT, **KW)
"""


@pytest.mark.parametrize("progress", [True, False])
def test_a_plain_script_shows_progress_on_stderr_unless_told_not_to(tmp_path, progress):
    """A script that configured no logging (stderr piped, not a terminal) gets the start-up and round lines from
    `raysim.run` by default; `progress=False` leaves stderr quiet."""
    import subprocess
    import sys

    code = SCRIPT.replace("OUT", repr(str(tmp_path / "run"))).replace("KW", "{}" if progress else "{'progress': False}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rounds = [line for line in done.stderr.splitlines() if "script: round" in line]
    if progress:
        assert [line.split("round ")[1].split()[0] for line in rounds] == ["1/3", "3/3"], done.stderr
    else:
        assert not rounds and "raysim INFO" not in done.stderr, done.stderr
