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


def test_a_shards_reply_travels_lean_and_arrives_with_the_same_bits(tmp_path, monkeypatch):
    """A round's reply leaves a shard on two threads pickled, as Ray sends it: its CPU seconds as its chunks' times
    (not a column of 8 bytes a client), its chunks' tree blocks merged into the shard's one block (a shard of every
    client: the root). It arrives with every column's bits, and its one part has the bits of the same clients
    reduced in one chunk."""
    import dataclasses
    import pickle

    from raysim.round import shard as shard_module
    from raysim.round.shard import CpuSplit

    monkeypatch.setattr(shard_module, "CHUNK_SECONDS", 1e-9)  # every step cut, however light
    tree = {**CHUNKED, "data": {**CHUNKED["data"], "num_clients": 6000, "synthetic_samples": 60000}}
    cfg = load_config(tree)
    fed = build_federated(cfg.data, cfg.seed, tmp_path)
    ids = np.sort(np.random.default_rng(0).choice(6000, 5000, replace=False))
    results = []
    for threads in (2, 1):
        shard = ClientShard(Experiment.of(cfg), fed.to_dict(), range(fed.num_clients), threads=threads)
        broadcast = shard.algo.plan(shard.algo.init(), 1, np.random.default_rng(0)).broadcast
        results.append(shard.train(1, ids, broadcast, reduce=True))
    sent, whole = results
    assert isinstance(sent.cpu, CpuSplit) and len(sent.cpu.ends) == 2 and len(sent.parts) == 1 == len(whole.parts)
    assert sent.parts[0][:2] == (0, 8192)  # the root: the shard holds the last client, so the empty edge after it
    wire = pickle.dumps(sent, protocol=5)
    assert len(pickle.dumps(dataclasses.replace(sent, cpu=sent.cpu_seconds), protocol=5)) - len(wire) > 8 * 5000 - 500
    got = pickle.loads(wire)
    for name in ("clients", "compute_times", "cpu_seconds"):
        a, b = getattr(sent, name), getattr(got, name)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name
    for (s, z, v), (s2, z2, v2), (s3, z3, v3) in zip(sent.parts, got.parts, whole.parts):
        assert (s, z) == (s2, z2) == (s3, z3)
        assert v.total.tobytes() == v2.total.tobytes() == v3.total.tobytes() and v.weight == v2.weight == v3.weight


def test_a_chunks_cpu_seconds_are_split_over_its_clients_by_their_oracle_calls():
    from raysim.round.shard import CpuSplit

    split = CpuSplit(np.array([3, 5]), np.array([6.0, 1.0]))
    np.testing.assert_array_equal(split.of(np.array([1, 2, 3, 0, 0])), [1.0, 2.0, 3.0, 0.5, 0.5])  # no calls: evenly
    assert CpuSplit(np.zeros(0, dtype=np.int64), np.zeros(0)).of(np.zeros(0, dtype=np.int64)).size == 0
