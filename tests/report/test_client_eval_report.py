"""`raysim report` draws a federated evaluation's per-client distribution over rounds (client_eval.png)."""
import raysim


CFG = {"name": "client-eval", "seed": 4, "backend": "local", "data": {"source": "digits", "num_clients": 12},
       "model": {"name": "logreg"}, "algorithm": {"name": "fedavg", "rounds": 4, "clients_per_round": 5},
       "eval": {"every": 2, "clients": "all"}, "checkpoint": {"every": 0}}


def test_report_draws_the_per_client_distribution(tmp_path):
    from raysim.report.reports import report

    result = raysim.run(CFG, out=tmp_path / "run", progress=False)
    written = report(result.run_dir)
    assert result.run_dir / "client_eval.png" in written and (result.run_dir / "client_eval.png").stat().st_size > 5000
    plain = raysim.run({**CFG, "eval": {"every": 2}}, out=tmp_path / "plain", progress=False)
    assert plain.client_eval.empty and plain.run_dir / "client_eval.png" not in report(plain.run_dir)
