"""raysim.training.stacked: the batched-matmul gradient is bitwise vmap(grad(loss))'s, for every loss, dtype and shape
LocalSGD trains, and only chains of linear layers and elementwise activations take it."""
import numpy as np
import pytest
import torch
from torch import nn

from raysim.contract import ClientData, Context
from raysim.core.rng import stream
from raysim.models import ModelConfig
from raysim.training import LocalSGD, LocalSGDParams, sample_losses
from raysim.training.stacked import ELEMENTWISE, StackedGrad, chain_of, stacked_grad


def vmap_grad(algo: LocalSGD, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """torch.func's vmap(grad(loss)) of the algorithm's loss at rows θ [k, d]: the kernels the stacked path issues."""
    return algo.spec.flatten(torch.func.vmap(torch.func.grad(algo._loss))(algo.spec.unflatten(theta), x, y, w))


def algorithm(model: ModelConfig, feature_shape: tuple, num_classes: int, **params) -> LocalSGD:
    ctx = Context(seed=0, rounds=2, clients_per_round=3, num_clients=3, client_sizes=np.full(3, 12),
                  feature_shape=feature_shape, image_shape=None, num_classes=num_classes, model=model,
                  params=LocalSGDParams(**params))
    return LocalSGD(ctx)


def with_activation(algo: LocalSGD, activation: type[nn.Module]) -> LocalSGD:
    """The algorithm's mlp with `activation` in place of ReLU (the same parameters)."""
    algo.module = nn.Sequential(*(activation() if isinstance(m, nn.ReLU) else m for m in algo.module))
    algo._stacked = stacked_grad(algo.module, algo.ctx.feature_shape, algo.spec, algo.params.loss,
                                 lambda out, y: sample_losses(out, y, algo.params.loss), algo.params.l2)
    return algo


def targets(kind: str, k: int, b: int, classes: int, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    if kind == "labels":
        return torch.randint(0, classes, (k, b), generator=g)
    if kind == "soft":
        return torch.softmax(torch.randn(k, b, classes, generator=g, dtype=dtype), -1)
    if kind == "unit":
        return torch.rand(k, b, generator=g, dtype=dtype)
    return torch.randn(k, b, classes, generator=g, dtype=dtype)


CASES = [  # (model, feature shape, classes, loss, targets)
    (ModelConfig(name="logreg"), (8, 8), 10, "ce", "labels"),
    (ModelConfig(name="mlp", hidden=[16]), (64,), 10, "ce", "labels"),
    (ModelConfig(name="mlp", hidden=[32, 16]), (4, 16), 10, "ce", "soft"),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("l2", [0.0, 0.05])
@pytest.mark.parametrize("model,shape,classes,loss,kind", CASES)
def test_stacked_gradient_is_vmaps_bit_for_bit(model, shape, classes, loss, kind, l2, dtype):
    algo = algorithm(model.model_copy(update={"dtype": dtype}), shape, classes, loss=loss, l2=l2)
    assert algo._stacked is not None
    g, dt = torch.Generator().manual_seed(7), algo.dtype
    for k, b in [(1, 10), (3, 7), (40, 1), (2, 33)]:
        theta = torch.randn(k, algo.spec.size, generator=g, dtype=dt) * 0.5
        x = torch.randn(k, b, *shape, generator=g, dtype=dt)
        y = targets(kind, k, b, classes, dt, g)
        w = (torch.rand(k, b, generator=g) > 0.3).to(dt)
        w[0, 0] = 1.0
        if k > 2:
            w[2] = 0.0  # a client past its last step (a padded one)
        vmapped = vmap_grad(algo, theta, x, y, w)
        assert torch.equal(algo.batch_grads(theta, x, y, w), vmapped), (k, b)


@pytest.mark.parametrize("loss", ["bce", "mse"])
def test_the_losses_vmap_batches_otherwise_keep_vmap(loss):
    assert algorithm(ModelConfig(name="mlp", hidden=[16]), (64,), 1, loss=loss)._stacked is None


@pytest.mark.parametrize("activation", [a for a in ELEMENTWISE if a is not nn.ReLU] + [lambda: nn.GELU("tanh")])
def test_other_elementwise_activations_take_the_stacked_path_with_vmaps_numbers(activation):
    algo = with_activation(algorithm(ModelConfig(name="mlp", hidden=[24, 12], dtype="float32"), (64,), 10), activation)
    assert algo._stacked is not None and algo._stacked.by_hand
    g = torch.Generator().manual_seed(1)
    theta = torch.randn(5, algo.spec.size, generator=g)
    x, y, w = torch.randn(5, 9, 64, generator=g) * 3, torch.randint(0, 10, (5, 9), generator=g), torch.ones(5, 9)
    fast = algo.batch_grads(theta, x, y, w)
    assert torch.equal(fast, autograd_grad(algo._stacked, theta, x, y, w))
    if activation is not nn.SiLU:  # torch.func differentiates silu by another formula than autograd's silu_backward
        assert torch.equal(fast, vmap_grad(algo, theta, x, y, w))


def autograd_grad(stacked: StackedGrad, *args: torch.Tensor) -> torch.Tensor:
    """The stacked gradient through autograd (its path before `grad_by_hand`, and still the path off a CPU)."""
    by_hand, stacked.by_hand = stacked.by_hand, False
    try:
        return stacked(*args)
    finally:
        stacked.by_hand = by_hand


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("model,shape", [(ModelConfig(name="mlp", hidden=[256]), (20,)),
                                         (ModelConfig(name="mlp", hidden=[64, 32]), (64,)),
                                         (ModelConfig(name="logreg"), (4, 5))])
def test_the_gradient_by_hand_is_autograds_bit_for_bit(model, shape, dtype):
    """Label cross-entropy without autograd on a CPU: the bits of its autograd, for few and many clients, short and
    padded batches, clients past their last step; each client's rows the same whichever clients share the call."""
    algo = algorithm(model.model_copy(update={"dtype": dtype}), shape, 10)
    stacked, g, dt = algo._stacked, torch.Generator().manual_seed(5), algo.dtype
    assert stacked is not None and stacked.by_hand
    for k, b in [(1, 5), (5, 10), (300, 5), (17, 1), (64, 33)]:
        theta = torch.randn(k, algo.spec.size, generator=g, dtype=dt) * 0.3
        x, y = torch.randn(k, b, *shape, generator=g, dtype=dt), torch.randint(0, 10, (k, b), generator=g)
        w = (torch.rand(k, b, generator=g) > 0.2).to(dt)
        w[-1] = 0.0  # a client past its last step
        fast = stacked(theta, x, y, w)
        assert torch.equal(fast, autograd_grad(stacked, theta, x, y, w)), (k, b)
        assert torch.equal(fast[:1], stacked(theta[:1], x[:1], y[:1], w[:1])), (k, b)


def test_the_gradient_goes_by_hand_only_where_autograd_is_mirrored():
    """Soft labels, l2 and an in-place activation keep autograd (their backward is not mirrored); so does a GPU."""
    labels = algorithm(ModelConfig(name="mlp", hidden=[16]), (64,), 10)._stacked
    assert labels is not None and labels.by_hand
    assert not algorithm(ModelConfig(name="mlp", hidden=[16]), (64,), 10, l2=0.1)._stacked.by_hand
    inplace = algorithm(ModelConfig(name="mlp", hidden=[16]), (64,), 10)
    inplace.module = nn.Sequential(*(nn.ReLU(inplace=True) if isinstance(m, nn.ReLU) else m for m in inplace.module))
    assert not with_activation(inplace, lambda: nn.ReLU(inplace=True))._stacked.by_hand


def test_local_training_is_the_same_with_and_without_the_stacked_path():
    """A shard's whole round (uneven clients, several epochs, padded steps) gives vmap's replies bit for bit."""
    algo = algorithm(ModelConfig(name="mlp", hidden=[16], dtype="float32"), (64,), 10, local_epochs=2, batch_size=4)
    g = torch.Generator().manual_seed(3)
    datas = [ClientData(c, torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))
             for c, n in enumerate([3, 9, 14, 1])]
    theta = algo.init().params
    rngs = lambda: [stream(0, 1, d.client_id, "step") for d in datas]  # noqa: E731
    fast = algo.step_many([None] * 4, datas, theta, rngs())
    algo._stacked = None
    slow = algo.step_many([None] * 4, datas, theta, rngs())
    for (a, _, ca), (b, _, cb) in zip(fast, slow):
        assert np.array_equal(a.total, b.total) and ca == cb


class Residual(nn.Sequential):
    def forward(self, x):
        return super().forward(x) + x


@pytest.mark.parametrize("module,dims,stacked", [
    (nn.Sequential(nn.Flatten(), nn.Linear(64, 10)), 2, True),
    (nn.Sequential(nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 3)), 1, True),
    (nn.Sequential(nn.Linear(8, 8), nn.Flatten(), nn.Linear(64, 3)), 2, False),  # a Linear over the last of 2 dims
    (nn.Sequential(nn.Flatten(), nn.Linear(64, 8), nn.Dropout(), nn.Linear(8, 3)), 2, False),
    (nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(144, 3)), 1, False),
    (nn.Sequential(nn.Flatten(start_dim=2), nn.Linear(64, 3)), 3, False),
    (Residual(nn.Linear(8, 8)), 1, False),
    (nn.Sequential(nn.ReLU()), 1, False),
    (nn.Linear(8, 3), 1, False),
])
def test_only_chains_of_linear_layers_and_elementwise_activations_are_stacked(module, dims, stacked):
    assert (chain_of(module, dims) is not None) == stacked
