"""One-shot protocol: local SGD with momentum, exact Costs, and every method end to end through Ray."""
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits

from raysim.algorithms.fedfisher.baselines import PFNM, FisherMerge, OneShotFedAvg, RegMean
from raysim.algorithms.fedfisher.oneshot import compare, method_config
from raysim.contract import ClientData, Context
from raysim.core.rng import stream
from raysim.models import ModelConfig, ParamSpec, build_model
from raysim.runner import run
from raysim.training import batch_plan


def make(cls, num_clients=2, per_round=2, **params):
    ctx = Context(seed=3, rounds=1, clients_per_round=per_round, num_clients=num_clients,
                  client_sizes=np.ones(num_clients), feature_shape=(64,), image_shape=(1, 8, 8), num_classes=10,
                  model=ModelConfig(name="mlp_nobias", hidden=[12], dtype="float64"), params=cls.Params(**params))
    return cls(ctx)


@pytest.fixture(scope="module")
def data():
    x, y = load_digits(return_X_y=True)
    return ClientData(0, torch.as_tensor(x[:90] / 16.0), torch.as_tensor(y[:90]))


def test_local_training_is_sgd_with_momentum_over_shuffled_epochs(data):
    algo = make(OneShotFedAvg, local_epochs=2, batch_size=16, lr=0.05, momentum=0.9)
    w0 = algo.init().params
    reply, _, cost = algo.step(None, data, w0, stream(0, 1, 0, "step"))
    module = build_model(algo.ctx.model, (64,), None, 10)
    spec = ParamSpec.of(module)
    w, buf = torch.as_tensor(w0, dtype=torch.float64), torch.zeros(spec.size, dtype=torch.float64)
    bp = batch_plan(90, 16, None, 2, stream(0, 1, 0, "step"))
    for idx, mask in zip(bp.idx, bp.w):
        b = idx[mask > 0]
        params = {k: v.requires_grad_(True) for k, v in spec.unflatten(w.clone()).items()}
        loss = F.cross_entropy(torch.func.functional_call(module, params, (data.x[b],)), data.y[b])
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, list(params.values()))])
        buf = 0.9 * buf + g
        w = w - 0.05 * buf
    np.testing.assert_allclose(reply.params, w.numpy(), atol=1e-12)
    assert cost.oracle_calls == 2 * 90 and cost.oracle_batches == 2 * 6
    assert cost.upload_vectors == 1.0 and cost.upload_bytes == spec.size * 8


def test_costs_of_the_statistics(data):
    fm = make(FisherMerge, local_epochs=1)
    _, _, cost = fm.step(None, data, fm.init().params, stream(0, 1, 0, "step"))
    d = fm.spec.size
    assert cost.oracle_calls == 90 + 90 * 10  # training + one pass of C per-class backward passes
    assert cost.upload_vectors == 2.0 and cost.upload_bytes == 2 * d * 8
    rm = make(RegMean, local_epochs=1)
    _, _, cost = rm.step(None, data, rm.init().params, stream(0, 1, 0, "step"))
    assert cost.oracle_calls == 90 + 90 and cost.upload_bytes == (d + 64**2 + 12**2) * 8


def test_one_shot_needs_every_client():
    with pytest.raises(ValueError, match="clients_per_round"):
        make(OneShotFedAvg, num_clients=3, per_round=2)


TINY = {
    "name": "tiny_oneshot", "seed": 0,
    "data": {"source": "digits", "num_clients": 5, "partition": {"kind": "dirichlet_classes", "alpha": 0.5}},
    "model": {"name": "mlp_nobias", "hidden": [16]},
    "algorithm": {"name": "fedfisher", "fisher": "kfac", "rounds": 1, "clients_per_round": 5, "local_epochs": 2,
                  "lr": 0.05, "server_steps": 200, "server_val_size": 100},
    "backend": "local",
}


def test_method_config_keeps_only_the_keys_a_method_accepts():
    tree = method_config(TINY, "fedavg", 4)
    assert tree["algorithm"]["name"] == "oneshot_fedavg" and "fisher" not in tree["algorithm"]
    assert tree["seed"] == 4 and tree["algorithm"]["local_epochs"] == 2
    assert method_config(TINY, "dense", 0)["algorithm"]["name"] == "dense"
    with pytest.raises(ValueError, match="unknown method 'fedbogus'; allowed: .*dense"):
        method_config(TINY, "fedbogus", 0)
    with pytest.raises(ValueError, match="algorithm.fisherr: unknown field"):  # no method takes it: not dropped
        method_config({**TINY, "algorithm": {**TINY["algorithm"], "fisherr": "diag"}}, "fedavg", 0)


@pytest.mark.slow  # about 2.5 min: every method through the runtime
def test_all_methods_end_to_end_on_the_same_local_models(tmp_path):
    methods = ["fedavg", "fisher_merge", "regmean", "fedfisher_diag", "fedfisher_kfac", "otfusion", "pfnm"]
    table = compare(TINY, methods, [0], tmp_path)
    assert list(table["method"]) == methods
    assert table["test_accuracy"].between(0.0, 1.0).all()
    calls = table.set_index("method")["client_oracle_calls"]
    train = calls["fedavg"]
    assert calls["fisher_merge"] == calls["fedfisher_diag"] == calls["fedfisher_kfac"] == train + 10 * train // 2
    assert (tmp_path / "oneshot.md").exists() and (tmp_path / "oneshot.png").exists()
    assert len(pd.read_parquet(tmp_path / "oneshot.parquet")) == len(methods)
    cpu = table.set_index("method")["client_cpu_s"]
    assert cpu["fedfisher_diag"] > cpu["fedavg"] and cpu["fedfisher_kfac"] > cpu["fedavg"]  # the Fisher pass (Table 1)


def test_pfnm_uploads_its_model_and_class_counts_and_is_one_shot_only(data):
    algo = make(PFNM, local_epochs=1)
    reply, _, cost = algo.step(None, data, algo.init().params, stream(0, 1, 0, "step"))
    np.testing.assert_array_equal(reply.stats, np.bincount(data.y.numpy(), minlength=10))
    d = algo.spec.size
    assert cost.oracle_calls == 90 and cost.upload_bytes == (d + 10) * 8
    with pytest.raises(ValueError, match="algorithm.rounds: PFNM is one-shot only"):
        PFNM(Context(seed=0, rounds=2, clients_per_round=2, num_clients=2, client_sizes=np.ones(2),
                     feature_shape=(64,), image_shape=None, num_classes=10, model=ModelConfig(name="mlp_nobias"),
                     params=PFNM.Params()))


def test_pfnm_end_to_end_records_its_widths(tmp_path):
    """Digits, Dirichlet(0.5) over classes, M = 5: the matched model beats chance and its widths are recorded."""
    tree = method_config({**TINY, "algorithm": {**TINY["algorithm"], "local_epochs": 5}}, "pfnm", 0)
    result = run(tree, out=tmp_path, progress=False)
    last = result.rounds.iloc[-1]
    assert last["test_accuracy"] > 0.5
    assert 16 <= last["pfnm_width_0"] <= 5 * 16
    assert (result.clients["upload_bytes"] == (ParamSpec.of(build_model(ModelConfig(name="mlp_nobias", hidden=[16]),
                                                                        (64,), None, 10)).size + 10) * 4).all()
