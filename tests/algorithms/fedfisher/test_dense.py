"""DENSE's pieces (FedFisher, algorithms/fedfisher/README.md) against closed forms and Monte Carlo, and the algorithm's selection."""
import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from raysim.algorithms.fedfisher.baselines import DENSE
from raysim.algorithms.fedfisher.dense import Generator, augment, distill, kldiv, reset, synthesize
from raysim.contract import Context
from raysim.models import ModelConfig


def test_kldiv_is_t_squared_kl_of_the_tempered_softmaxes():
    rng = np.random.default_rng(0)
    s, t = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    temp = 3.0
    p = np.exp(t / temp) / np.exp(t / temp).sum(1, keepdims=True)
    q = np.exp(s / temp) / np.exp(s / temp).sum(1, keepdims=True)
    expect = temp**2 * (p * np.log(p / q)).sum() / 5
    assert float(kldiv(torch.as_tensor(s), torch.as_tensor(t), temp)) == pytest.approx(expect, rel=1e-12)


def test_augment_crops_and_flips_each_image_independently():
    """Every view is a 6x6 window of the zero-padded image (pad 4), maybe mirrored; offsets and flips are drawn per
    image: uniform over the 9x9 offsets and fair flips (Monte Carlo, 4 sd)."""
    n, side, pad = 3000, 6, 4
    x = torch.rand(n, 1, side, side, dtype=torch.float64) + 1.0  # positive: the padding's zeros are recognizable
    out = augment(x, torch.Generator().manual_seed(0))
    padded = torch.nn.functional.pad(x, (pad,) * 4)
    windows = padded.unfold(2, side, 1).unfold(3, side, 1)  # n, 1, 9, 9, side, side
    plain = (windows == out[:, :, None, None]).flatten(4).all(-1)[:, 0]
    mirrored = (windows == out.flip(-1)[:, :, None, None]).flatten(4).all(-1)[:, 0]
    assert ((plain | mirrored).flatten(1).sum(1) == 1).all()  # exactly one window explains each view
    flipped = mirrored.flatten(1).any(1).double()
    assert abs(flipped.mean() - 0.5) < 4 * 0.5 / np.sqrt(n)
    offsets = (plain | mirrored).flatten(1).double().mean(0)
    assert (offsets - 1 / 81).abs().max() < 4 * np.sqrt(1 / 81 * (1 - 1 / 81) / n)


def test_generator_shape_range_and_reset():
    gen = Generator(nz=32, ngf=8, image_shape=(1, 28, 28)).double()
    reset(gen, torch.Generator().manual_seed(0))
    w = gen.l1.weight.detach()
    assert w.std().item() == pytest.approx(0.02, rel=4 / np.sqrt(2 * w.numel()))  # sd of the sample sd: 0.02/sqrt(2N)
    assert (gen.l1.bias == 0).all() and gen.conv_blocks[0].weight.mean().item() == pytest.approx(1.0, abs=4 * 0.02 / 4)
    img = gen(torch.randn(5, 32, dtype=torch.float64))
    assert img.shape == (5, 1, 28, 28) and 0 <= img.min() and img.max() <= 1
    with pytest.raises(ValueError, match="divisible by 4"):
        Generator(8, 4, (1, 10, 10))


def test_synthesis_starts_from_a_reset_generator_and_reaches_the_random_targets():
    """One iteration returns the reset generator's image of z (8-bit, as the reference's PNG pool); 40 Adam steps on
    (generator, z) with adv = 0 make a teacher that is smooth and mirror-symmetric (so nearly blind to the crops and
    flips) give most images their random target (chance: 0.1)."""
    torch.manual_seed(0)
    field = torch.nn.functional.interpolate(torch.randn(10, 1, 4, 4, dtype=torch.float64), size=(28, 28),
                                            mode="bilinear", align_corners=False)
    field = (field + field.flip(-1)).flatten(1)

    def teacher(x):
        return 0.1 * x @ field.T

    gen = Generator(nz=16, ngf=4, image_shape=(1, 28, 28)).double()
    replay = torch.Generator().manual_seed(1)
    reset(gen, replay)
    z = torch.randn(64, 16, generator=replay, dtype=torch.float64)
    targets = torch.randint(0, 10, (64,), generator=replay).sort()[0]
    with torch.no_grad():
        start = torch.round(gen(z) * 255) / 255
    first = synthesize(teacher, teacher, gen, 16, 10, 64, 1, 0.05, 1.0, 0.0, torch.Generator().manual_seed(1))
    torch.testing.assert_close(first, start, rtol=0, atol=1e-12)
    images = synthesize(teacher, teacher, gen, 16, 10, 64, 40, 0.05, 1.0, 0.0, torch.Generator().manual_seed(1))
    assert (teacher(images.flatten(1)).argmax(1) == targets).double().mean() > 0.4


def test_a_distillation_step_is_sgd_on_the_tempered_kl():
    """A student equal to its teacher stays put (the KL's gradient is 0 there). Otherwise, for a linear student
    s = W x and a pool of one mirror-symmetric batch (flips are no-ops), the step is W − lr T (q − p)ᵀ X / B with
    q, p the student's and teacher's tempered softmaxes."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(64, 10, bias=False)).double()
    half = torch.rand(30, 1, 8, 4, dtype=torch.float64)
    pool = torch.cat([half, half.flip(-1)], -1)
    twin = nn.Sequential(nn.Linear(64, 10, bias=False)).double()
    twin.load_state_dict(teacher.state_dict())
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    assert distill(twin, teacher, pool, opt, 8, 20.0, torch.Generator().manual_seed(0)) == 4  # ceil(30/8) steps
    torch.testing.assert_close(twin[0].weight, teacher[0].weight, rtol=0, atol=1e-15)
    student = nn.Sequential(nn.Linear(64, 10, bias=False)).double()
    w = student[0].weight.detach().clone()
    x = pool.flatten(1)
    temp, lr = 20.0, 0.01
    q = torch.softmax(x @ w.T / temp, 1)
    p = torch.softmax(teacher(x).detach() / temp, 1)
    expect = w - lr * temp * (q - p).T @ x / len(x)
    opt = torch.optim.SGD(student.parameters(), lr=lr, momentum=0.9)
    assert distill(student, teacher, pool, opt, 32, temp, torch.Generator().manual_seed(1)) == 1
    torch.testing.assert_close(student[0].weight.detach(), expect, rtol=1e-12, atol=1e-14)


def make(**params):
    ctx = Context(seed=3, rounds=1, clients_per_round=3, num_clients=3, client_sizes=np.ones(3), feature_shape=(64,),
                  image_shape=(1, 8, 8), num_classes=10, model=ModelConfig(name="mlp_nobias", hidden=[12],
                                                                           dtype="float64"),
                  params=DENSE.Params(**params))
    return DENSE(ctx)


def test_dense_keeps_the_epoch_best_on_validation_and_counts_its_steps(monkeypatch):
    x, y = load_digits(return_X_y=True)
    x, y = torch.as_tensor(x[:300] / 16.0), torch.as_tensor(y[:300])
    monkeypatch.setattr(DENSE, "validation", (x, y))
    algo = make(nz=8, ngf=4, epochs=3, gen_iterations=3, synthesis_batch_size=16, sample_batch_size=16)
    rng = np.random.default_rng(0)
    replies = [type("R", (), {"params": rng.standard_normal(algo.spec.size), "n": n})() for n in (10, 20, 30)]
    scored = []
    monkeypatch.setattr(DENSE, "val_accuracy", lambda self, v: scored.append(v) or float(len(scored) == 2))
    state, cost = algo.aggregate(algo.init(), replies, np.random.default_rng(1))
    assert len(scored) == 3
    np.testing.assert_array_equal(state.params, scored[1])  # the epoch with the best validation score
    assert cost.oracle_calls == 3 * 300 and cost.oracle_batches == 3 * 3 + (1 + 2 + 3)


def test_dense_needs_images():
    with pytest.raises(ValueError, match="image shape"):
        DENSE(Context(seed=0, rounds=1, clients_per_round=2, num_clients=2, client_sizes=np.ones(2),
                      feature_shape=(64,), image_shape=None, num_classes=10, model=ModelConfig(name="mlp_nobias"),
                      params=DENSE.Params()))


@pytest.mark.slow
def test_dense_beats_fedavg_on_digits_lenet_with_a_small_generator(ray_cluster, tmp_path):
    """Table 2's DENSE on the CPU stand-in (digits at 28x28, LeNet, M = 5, alpha 0.2), seeds 0-4, a small generator
    (ngf 16, nz 64) and 10 epochs. Measured per seed (test accuracy %, DENSE / FedAvg / gap): 75.77 / 57.38 / +18.39,
    56.82 / 48.19 / +8.63, 60.17 / 64.07 / -3.90, 67.69 / 50.97 / +16.72, 69.36 / 63.51 / +5.85; means 65.96 and
    56.82, a gap of 9.14 with a sample std of 9.0 over seeds (4.0 for its 5-seed mean). Uncompressed FedFisher K-FAC
    read 80.87 ± 4.37 on seeds 0-2: the paper has DENSE above FedAvg and best in Table 2; at this size it is only the
    former. The numbers are bitwise the same run to run on one machine, but not across CPUs: torch's float32
    kernels sum in another order under AVX2 than under AVX-512, and 30 local epochs turn that last bit into test
    samples (FedAvg's seeds 0-2 mean read 56.27-57.01 under the four ATen/oneDNN ISA settings of one AVX-512 machine,
    58.03 on another). So the test asks for a 4-point gap: 5 points (1.3 std of the mean) below the measurement,
    more than three times the largest move of a mean seen across kernels, and still DENSE clearly ahead."""
    from raysim.algorithms.fedfisher.oneshot import compare

    table = compare("configs/fedfisher/fedfisher_digits.yaml", ["fedavg", "dense"], [0, 1, 2, 3, 4], tmp_path,
                    ["algorithm.ngf=16", "algorithm.nz=64", "algorithm.epochs=10"])
    acc = table.pivot(index="seed", columns="method", values="test_accuracy") * 100
    gap = acc["dense"].mean() - acc["fedavg"].mean()
    assert gap > 4, f"DENSE - FedAvg = {gap:.2f} points; per seed:\n{acc.round(2).to_string()}"
