"""raysim.training.vmapped: a convolutional model's gradients are torch.func's vmap(grad(loss)) bit for bit, and a
client's are the same whichever clients share its call and however many; the call pads to its fixed width."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from raysim.contract import Context
from raysim.models import ModelConfig
from raysim.training import LocalSGD, LocalSGDParams, sample_losses
from raysim.training.vmapped import CPU_MAX_WIDTH, in_fixed_calls, sample_macs, vmap_width

IMAGE = (3, 8, 8)  # three input channels: vmap's grouped convolution changes its kernels with the number of clients


def algorithm(**params) -> LocalSGD:
    ctx = Context(seed=0, rounds=2, clients_per_round=100, num_clients=100, client_sizes=np.full(100, 12),
                  feature_shape=(192,), image_shape=IMAGE, num_classes=10,
                  model=ModelConfig(name="cnn", channels=[32]), params=LocalSGDParams(**params))
    return LocalSGD(ctx)


def batch(algo: LocalSGD, k: int, b: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(k, algo.spec.size, generator=g) * 0.2
    x, y = torch.randn(k, b, 192, generator=g), torch.randint(0, 10, (k, b), generator=g)
    w = (torch.rand(k, b, generator=g) > 0.2).float()
    w[:, 0] = 1.0
    return theta, x, y, w


def vmap_grad(algo: LocalSGD, theta, x, y, w) -> torch.Tensor:
    return algo.spec.flatten(torch.func.vmap(torch.func.grad(algo._loss))(algo.spec.unflatten(theta), x, y, w))


def test_a_call_of_the_fixed_width_is_vmap_grads_bit_for_bit():
    algo = algorithm(l2=0.01)
    assert algo._stacked is None and algo._vgrad.width == 16  # 63,680 multiply-adds a sample, 10 samples a client
    theta, x, y, w = batch(algo, 16)
    assert torch.equal(algo.batch_grads(theta, x, y, w), vmap_grad(algo, theta, x, y, w))


def test_a_clients_gradient_does_not_depend_on_who_shares_its_call():
    """Unchunked, vmap(grad) gives client 0 other bits as 1, 3 or 17 clients share the call (the premise); through
    the fixed-width calls its bits are the same alone, at any position and among any number of clients."""
    algo = algorithm()
    theta, x, y, w = batch(algo, 40)
    plain = [vmap_grad(algo, theta[:k], x[:k], y[:k], w[:k])[0] for k in (1, 3, 17, 40)]
    assert any(not torch.equal(plain[0], p) for p in plain[1:]), "vmap no longer changes with the clients: rethink"
    alone = algo.batch_grads(theta[:1], x[:1], y[:1], w[:1])[0]
    for k in (3, 17, 40):
        assert torch.equal(algo.batch_grads(theta[:k], x[:k], y[:k], w[:k])[0], alone), k
    order = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    moved = algo.batch_grads(theta[order], x[order], y[order], w[order])
    assert torch.equal(moved[int((order == 0).nonzero())], alone)


def test_a_samples_multiply_adds_are_counted_layer_by_layer():
    """The 8x8-digit CNN with channels (8, 8): conv 64·8 outputs of 9 inputs, ReLU, pool to 16·8, conv 16·8 of 72,
    ReLU, pool to 4·8, flatten, linear 10 of 32, and the unflatten's 64."""
    from raysim.models import build_model
    module = build_model(ModelConfig(name="cnn", channels=[8, 8]), (64,), (1, 8, 8), 10)
    assert sample_macs(module, (64,), torch.float32) == 4608 + 512 + 128 + 9216 + 128 + 32 + 32 + 320 + 64
    assert module.training  # counted in eval mode, and left as it was
    module[1].eval()  # a part frozen in eval mode stays so
    sample_macs(module, (64,), torch.float32)
    assert [m.training for m in module] == [True, False] + [True] * (len(module) - 2)


@pytest.mark.parametrize("client_macs, per_round, width", [
    (10_000_000, 1000, 1), (14_000_000, 1000, 1), (700_000, 1000, 16), (1_000, 1000, CPU_MAX_WIDTH), (1_000, 10, 10),
    (50_000_000, 1000, 1)])
def test_a_cpu_call_holds_about_its_bookkeepings_worth_of_arithmetic(client_macs, per_round, width):
    assert vmap_width(torch.device("cpu"), client_macs, per_round) == width


def test_a_heavy_model_steps_its_clients_one_at_a_time_unvmapped():
    """14 million multiply-adds a client-step: width 1, each client its own torch.func.grad, bit for bit."""
    ctx = Context(seed=0, rounds=2, clients_per_round=100, num_clients=100, client_sizes=np.full(100, 12),
                  feature_shape=(768,), image_shape=(3, 16, 16), num_classes=10,
                  model=ModelConfig(name="cnn", channels=[32, 64]), params=LocalSGDParams())
    algo = LocalSGD(ctx)
    assert algo._vgrad.width == 1
    g = torch.Generator().manual_seed(3)
    theta, x = torch.randn(3, algo.spec.size, generator=g) * 0.1, torch.randn(3, 10, 768, generator=g)
    y, w = torch.randint(0, 10, (3, 10), generator=g), torch.ones(3, 10)
    grads = algo.batch_grads(theta, x, y, w)
    for i in range(3):
        one = torch.func.grad(algo._loss)(algo.spec.unflatten(theta[i]), x[i], y[i], w[i])
        assert torch.equal(grads[i], algo.spec.flatten(one)), i


def test_fixed_calls_pad_the_last_call_and_drop_its_padding():
    seen = []
    out = in_fixed_calls(lambda a, b: seen.append(len(a)) or a * 10 + b, 4, torch.arange(10.0), torch.ones(10))
    assert seen == [4, 4, 4] and torch.equal(out, torch.arange(10.0) * 10 + 1)


def test_the_per_client_step_is_the_batched_steps_client():
    """`step` (the per-client reference, `vectorize: false`) runs one client through the same fixed-width calls."""
    from raysim.contract import ClientData
    from raysim.core.rng import stream
    algo = algorithm(local_steps=3, batch_size=4, lr=0.1)
    g = torch.Generator().manual_seed(2)
    datas = [ClientData(c, torch.randn(12, 192, generator=g), torch.randint(0, 10, (12,), generator=g)) for c in range(3)]
    theta = algo.init().params
    many = algo.step_many([None] * 3, datas, theta, [stream(0, 1, c, "step") for c in range(3)])
    for d, (reply, _, cost) in zip(datas, many):
        one, _, one_cost = algo.step(None, d, theta, stream(0, 1, d.client_id, "step"))
        assert np.array_equal(one.total, reply.total) and one_cost == cost


def test_training_a_cnn_never_imports_torch_dynamo():
    """torch.func's gradient transform imports torch._dynamo (1.2 s a process); the vmapped forward does not."""
    code = ("import sys, torch; from tests.training.test_vmapped import algorithm, batch;"
            " a = algorithm(); a.batch_grads(*batch(a, 5)); assert 'torch._dynamo' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_mse_of_class_labels_differentiates_under_torch_funcs_transforms():
    """½‖out − onehot(y)‖² has gradient out − onehot(y) in `out`, also under vmap(grad) (the per-example gradients of
    DP sketching), where `F.one_hot`'s read of the largest label is refused."""
    g = torch.Generator().manual_seed(5)
    out, y = torch.randn(4, 6, 3, generator=g, dtype=torch.float64), torch.randint(0, 3, (4, 6), generator=g)
    grads = torch.func.vmap(torch.func.grad(lambda o, t: sample_losses(o, t, "mse").sum()))(out, y)
    assert torch.equal(grads, out - torch.nn.functional.one_hot(y, 3).to(out.dtype))


@pytest.mark.parametrize("model", [{"name": "cnn", "channels": [4]}, {"name": "logreg"}])
def test_mse_trains_on_class_labels_as_one_hot_targets(model):
    """loss: mse with class labels: ½‖out − onehot(y)‖², under vmap and the per-client step alike. For logistic
    regression the local step has the closed form ∇ = xᵀ(xθ + b − onehot(y)) / B."""
    ctx = Context(seed=0, rounds=1, clients_per_round=2, num_clients=2, client_sizes=np.full(2, 8),
                  feature_shape=(16,), image_shape=(1, 16), num_classes=3, model=ModelConfig(**model),
                  params=LocalSGDParams(loss="mse", local_steps=1, batch_size=None, lr=0.5))
    algo = LocalSGD(ctx)
    g = torch.Generator().manual_seed(4)
    theta = torch.randn(2, algo.spec.size, generator=g, dtype=algo.dtype) * 0.1
    x, y = torch.randn(2, 8, 16, generator=g, dtype=algo.dtype), torch.randint(0, 3, (2, 8), generator=g)
    grads = algo.batch_grads(theta, x, y, torch.ones(2, 8, dtype=algo.dtype))
    assert torch.isfinite(grads).all() and grads.abs().sum() > 0
    if model["name"] == "logreg":
        params = algo.spec.unflatten(theta)
        W, b = params["1.weight"], params["1.bias"]  # [2, 3, 16], [2, 3]
        r = torch.einsum("kbi,koi->kbo", x, W) + b[:, None] - torch.nn.functional.one_hot(y, 3).to(x.dtype)
        expected = algo.spec.flatten({"1.weight": torch.einsum("kbo,kbi->koi", r, x) / 8, "1.bias": r.sum(1) / 8})
        torch.testing.assert_close(grads, expected, rtol=1e-5, atol=1e-6)
