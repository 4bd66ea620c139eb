"""How a shard cuts a batched step over its threads (by clients until a step has been timed, then by CPU time),
and how it warms up."""
import subprocess
import sys

import numpy as np
import pytest

from raysim.config import load_config
from raysim.core import compiled
from raysim.data import build_federated
from raysim.round.experiment import Experiment
from raysim.round.shard import CHUNK_SECONDS, MIN_CHUNK, ClientShard, step_chunks

from .test_local import CHUNKED


def test_a_step_is_cut_by_its_clients_until_timed_then_by_its_cpu_seconds():
    assert step_chunks(4, None) == 4  # untimed: MIN_CHUNK clients a chunk, up to the threads
    assert step_chunks(4, 0.0) == step_chunks(4, 0.9 * CHUNK_SECONDS) == 1  # light: whole, on one thread
    assert step_chunks(4, 2.5 * CHUNK_SECONDS) == 2  # each chunk holds CHUNK_SECONDS
    assert step_chunks(4, 100 * CHUNK_SECONDS) == 4 and step_chunks(1, 100 * CHUNK_SECONDS) == 1  # at most the cut


def test_a_shard_times_each_step_it_could_cut(tmp_path):
    cfg = load_config(CHUNKED)
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    shard = ClientShard(Experiment.of(cfg), fed.to_dict(), range(fed.num_clients), threads=2)
    broadcast = shard.algo.plan(shard.algo.init(), 1, np.random.default_rng(0)).broadcast
    shard.train(1, list(range(MIN_CHUNK)), broadcast, reduce=True)  # one chunk's worth: nothing to choose
    assert shard.step_cpu is None
    shard.train(1, list(range(0, 1200, 2)), broadcast, reduce=True)
    assert shard.step_cpu is not None and 0 < shard.step_cpu < 1


def test_a_shard_caps_its_processs_parallel_kernels_at_its_cpu_share(tmp_path, monkeypatch, one_torch_thread):
    """A shard's CPU share (its host threads times its torch threads: a client actor's CPUs) caps the threads of its
    process's parallel kernels, as it sets its torch threads."""
    monkeypatch.setattr(compiled, "_SHARE", None)  # restored after the test
    cfg = load_config(CHUNKED)
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    ClientShard(Experiment.of(cfg), fed.to_dict(), range(fed.num_clients), threads=3)
    assert compiled.host_threads(16) == 3 and compiled.host_threads(2) == 2
    ClientShard(Experiment.of(cfg), fed.to_dict(), range(fed.num_clients), torch_threads=2, threads=2)
    assert compiled.host_threads(16) == 4


def test_the_warm_up_steps_a_client_as_the_rounds_do(tmp_path, monkeypatch):
    """A batched algorithm warms up through `step_batch` of one client, the rounds' path, not the per-client `step`."""
    cfg = load_config(CHUNKED)
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    shard = ClientShard(Experiment.of(cfg), fed.to_dict(), range(fed.num_clients))
    batches = []
    monkeypatch.setattr(shard.algo, "step", lambda *a: pytest.fail("warmed up through the per-client step"))
    monkeypatch.setattr(shard.algo, "step_batch", lambda *a, f=shard.algo.step_batch: batches.append(a) or f(*a))
    shard.warm_up()
    assert len(batches) == 1 and len(batches[0][1]) == 1


def test_a_local_run_of_a_stacked_model_never_imports_torch_dynamo(tmp_path):
    """torch.func's gradient imports torch._dynamo (1.2-1.7 s, a process's start-up doubled); the stacked kernels
    that train logistic regression and MLPs do not need it, and the warm-up must not pull it in either."""
    code = (f"import sys, raysim; raysim.run({CHUNKED!r}, out={str(tmp_path / 'run')!r}, backend='local', progress=False);"
            " assert 'torch._dynamo' not in sys.modules; assert 'scipy.special' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_shard_of_one_call_leaves_the_compute_times_to_the_server_where_they_drop_no_client(tmp_path):
    """A shard that steps its clients in one call (a GPU's, a per-client algorithm's) on its one host thread samples no
    compute times that decide nothing it aggregates: the server samples the same keyed draws after the aggregation
    (on Ray, once the next round is sent). Its runs' tables are those of the same run whose deadline, missed by no
    client, has the shard sample them, bit for bit."""
    import pandas as pd

    import raysim
    from raysim.results import reproducible

    per_client = {**CHUNKED, "data": {**CHUNKED["data"], "num_clients": 60}, "system": {"compute": {"unit": "batch"}},
                  "algorithm": {**CHUNKED["algorithm"], "clients_per_round": 20, "vectorize": False}}
    timed = {**per_client, "system": {**per_client["system"], "stragglers": {"deadline": 1e9}}}
    for tree, sampled in ((per_client, False), (timed, True)):
        cfg = load_config(tree)
        fed = build_federated(cfg.data, cfg.seed, tmp_path / cfg.name)
        shard = ClientShard(Experiment.of(cfg), fed.to_dict(), range(fed.num_clients))
        broadcast = shard.algo.plan(shard.algo.init(), 1, np.random.default_rng(0)).broadcast
        assert (shard.train(1, [3, 8, 40], broadcast, reduce=True).compute_times is not None) == sampled
    server, own = (raysim.run(t, out=tmp_path / name, backend="local") for t, name in ((per_client, "server"), (timed, "own")))
    assert (server.clients["compute_time"] > 0).all() and not server.clients["dropped"].any()
    pd.testing.assert_frame_equal(reproducible(server.rounds), reproducible(own.rounds))
    pd.testing.assert_frame_equal(reproducible(server.clients), reproducible(own.clients))


@pytest.mark.parametrize("ids", [pytest.param(np.arange(5, 12), id="a run"), pytest.param(np.array([3, 7, 9, 10, 20]),
                                                                                          id="scattered")])
def test_a_shards_rows_find_their_clients_and_name_those_they_do_not_hold(ids):
    """A shard's block of rows finds a client by its position (a run of ids: the id less the first; else a search):
    each client's rows are its own, alone or in a batch, and a client it does not hold is a KeyError naming it."""
    import torch

    from raysim.round.shard import ClientRows

    sizes = np.arange(1, len(ids) + 1)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rows = ClientRows(ids, offsets, torch.arange(offsets[-1]), torch.arange(offsets[-1]) * 10)
    for j, c in enumerate(ids.tolist()):
        assert rows[c].x.tolist() == list(range(offsets[j], offsets[j + 1]))
    batch = rows.batch(ids[[1, 3]])
    assert batch.starts.tolist() == offsets[[1, 3]].tolist() and batch.sizes.tolist() == sizes[[1, 3]].tolist()
    for missing in [int(ids[0]) - 1, int(ids[-1]) + 1] + [c for c in (8,) if c not in ids]:
        with pytest.raises(KeyError, match=str(missing)):
            rows.batch(np.array([int(ids[0]), missing]))
        with pytest.raises(KeyError):
            rows[missing]
